"""A prompt prefix that several rows of one optimizer update share, computed once per update instead of once per row.

Every prompt of a role starts with the same system prompt and worked example, and the rows of one question share
their whole prompt: when the update trains the Solver only (`train.roles: [solver]`), about half the tokens of an
update are prefix that every row of it repeats (`python -m bench.prefixes`). The transformer's activations over a
prefix are the same in every row that starts with it, so the update can run the prefix once and continue each row
from its keys and values.

How, exactly: `update_prefixes` groups the update's prompts by the prefixes they share (a role's prompts of one
kind share its system prompt and worked example), so as to save the most tokens, each group's prefix shorter
than each of its prompts (every row keeps at least one prompt token of its own). The first pass
that needs a prefix runs it through the model with gradients (`SharedPrefixes.cache`) and keeps its graph; each
pass then starts from float32 leaf copies of the prefix's keys and values, so the passes' backward steps add up
their gradients with respect to the prefix in those leaves. When the last pass of the prefix's rows is done,
`release()` sends the summed gradients back through the prefix's graph once and frees it, before the optimizer
steps. The trainer runs an update's rows grouped by prefix (`grouped`), so an update holds the prefixes of one
micro-batch at a time (one, at `cpu.yaml`'s one row a pass), not every prefix it shares. The gradients of the
LoRA weights are those of running every row whole (the prefix's parameters see the sum of each row's
contribution), within the rounding of a different matmul split; the loss is the same.

Only for one process without gradient checkpointing (`StoredRowsTrainer` decides): under data parallelism the
gradients are reduced at the last pass's backward, before `release()` could add the prefix's; checkpointing
does not keep a cache.
"""

from __future__ import annotations

from typing import Sequence

#: A prefix shorter than this is not worth a pass of its own.
MIN_SHARED = 16


def usable(cfg) -> bool:
    """Whether `cfg` (a `TrainConfig`) asks for shared prefixes where they keep the update exact: one process,
    no gradient checkpointing (see the module docstring)."""
    from accelerate import PartialState

    return cfg.share_prefix and not cfg.gradient_checkpointing and PartialState().num_processes == 1


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def update_prefixes(prompts: list[Sequence[int]], min_shared: int = MIN_SHARED) -> list[tuple]:
    """The prefixes one update's rows share, chosen to save the most tokens: the prompts in lexicographic order
    (where prompts sharing a prefix are neighbours) are cut into runs, a run of k prompts whose common prefix is
    n tokens (cut so that each keeps one token of its own) saving n * (k - 1) when n >= `min_shared`, and the
    best cut is found by dynamic programming (an update has a few dozen rows). Every prompt of a role opens with
    the same chat header, so a low `min_shared` alone would merge a role's math and code prompts on those few
    tokens and lose the long prefix each kind shares. Longest first."""
    ordered = sorted(prompts, key=list)
    n = len(ordered)
    adjacent = [common_prefix(ordered[k], ordered[k + 1]) for k in range(n - 1)]
    best = [0] * (n + 1)  # best[i]: most tokens saved by the first i prompts
    choice: list[tuple[int, int]] = [(0, 0)] * (n + 1)  # (start of the last run, its prefix length or 0)
    for i in range(1, n + 1):
        best[i], choice[i] = best[i - 1], (i - 1, 0)  # prompt i - 1 alone
        shared, shortest = len(ordered[i - 1]), len(ordered[i - 1])
        for j in range(i - 2, -1, -1):  # the run ordered[j:i]
            shared, shortest = min(shared, adjacent[j]), min(shortest, len(ordered[j]))
            length = min(shared, shortest - 1)
            if length < min_shared:
                break  # a longer run shares no more
            if best[j] + length * (i - 1 - j) > best[i]:
                best[i], choice[i] = best[j] + length * (i - 1 - j), (j, length)
    out, i = set(), n
    while i > 0:
        j, length = choice[i]
        if length:
            out.add(tuple(ordered[j][:length]))
        i = j
    return sorted(out, key=len, reverse=True)


class SharedPrefixes:
    """One update's shared prefixes: each computed at its first use, its keys and values handed to every pass
    that continues from it, and its graph run backward once by `release()`, as soon as every row of the update
    that starts with it has been served."""

    def __init__(self, prompts: list[Sequence[int]] = ()):
        """The prefixes the update of these `prompts` (one per row) shares (`update_prefixes`), and how many of
        its rows each will serve, so that `release` knows when a prefix's last row is done."""
        self.prefixes = update_prefixes(prompts)  # longest first
        self._computed: dict[tuple, tuple[list, list]] = {}  # prefix -> (graph tensors, float32 leaves)
        self.rows_served: dict[tuple, int] = {}
        self.rows_expected: dict[tuple, int] = {}
        for prompt in prompts:
            p = self.match(prompt)
            if p is not None:
                self.rows_expected[p] = self.rows_expected.get(p, 0) + 1

    def match(self, prompt: Sequence[int]) -> tuple | None:
        """The longest prefix of the update that `prompt` starts with and goes beyond, else None."""
        for p in self.prefixes:
            if len(prompt) > len(p) and tuple(prompt[:len(p)]) == p:
                return p
        return None

    def cache(self, model, prefix: tuple, batch: int, device):
        """A fresh `DynamicCache` holding `prefix`'s keys and values for `batch` rows (computed at first use, with
        gradients, by `model` under the caller's autocast); the rows' forward appends theirs to it."""
        import torch
        from transformers import DynamicCache

        from sage.engines.train.logprobs import CompletionHead

        if prefix not in self._computed:
            ids = torch.tensor([prefix], dtype=torch.long, device=device)
            filled = DynamicCache()
            none = torch.zeros(0, dtype=torch.long, device=device)
            model(input_ids=ids, cache=filled, completion_head=CompletionHead(
                positions=none, targets=none, temperatures=torch.zeros(0, device=device)))
            graph = [t for layer in filled.layers for t in (layer.keys, layer.values)]
            leaves = [t.detach().float().requires_grad_(True) for t in graph]
            self._computed[prefix] = (graph, leaves)
        graph, leaves = self._computed[prefix]
        self.rows_served[prefix] = self.rows_served.get(prefix, 0) + batch
        kv = [leaf.to(g.dtype).expand(batch, -1, -1, -1) for leaf, g in zip(leaves, graph)]
        return DynamicCache(ddp_cache_data=list(zip(kv[0::2], kv[1::2])))

    def release(self, everything: bool = False) -> int:
        """Send the gradients the passes left in the leaves back through the graph of each prefix whose expected
        rows have all been served (every computed prefix when `everything`: the update's end), once; free both.
        Call it after a pass's backward. Returns the prefix tokens not recomputed (each released prefix's length
        times the rows it served, less one)."""
        import torch

        done = [p for p in self._computed
                if everything or self.rows_served.get(p, 0) >= self.rows_expected.get(p, float("inf"))]
        tensors, grads, saved = [], [], 0
        for prefix in done:
            graph, leaves = self._computed.pop(prefix)
            saved += len(prefix) * (self.rows_served.pop(prefix) - 1)
            for g, leaf in zip(graph, leaves):
                if leaf.grad is not None:
                    tensors.append(g)
                    grads.append(leaf.grad.to(g.dtype))
        if tensors:
            torch.autograd.backward(tensors, grads)
        return saved


def grouped(prefixes: SharedPrefixes, batch: dict) -> dict:
    """A generation batch (its tensors one row per row, prompts left-padded) with the rows that start with one
    shared prefix made consecutive, the groups in the order of their first row and each group's rows in their
    order (rows without a prefix form a group of their own): the micro-steps then finish one prefix's rows before
    starting the next's, and `release` frees each prefix's graph at its last row. The rows of the update are
    unchanged, only their order within it, and so is its gradient with the losses that do not depend on how an
    update is cut into micro-batches (`dapo`, `grpo`, `dr_grpo`; `bnpo` divides by each micro-batch's tokens)."""
    import torch

    from sage.engines.train.rows import reordered

    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"])]
    first: dict = {}
    keys = [first.setdefault(prefixes.match(p), len(first)) for p in prompts]
    return reordered(batch, torch.tensor(sorted(range(len(keys)), key=lambda i: keys[i]), dtype=torch.long))


def completion_logprobs_after(model, prefix_cache, prefix_len: int, input_ids, attention_mask, logits_to_keep: int,
                              temperatures, *, entropy: bool = False):
    """`logprobs.completion_logprobs` for rows that all start with one shared prefix of `prefix_len` tokens whose
    keys and values `prefix_cache` holds: the rows' remaining tokens (the rest of the prompt, then the completion)
    go right-padded through `model` after the cache. Right padding needs no mask: a real token attends only to
    earlier positions, and the padding positions are never scored. Same layout in and out as
    `completion_logprobs`: [B, logits_to_keep] log-probs (and entropies when `entropy`)."""
    import torch

    from sage.engines.train.logprobs import CompletionHead, in_layout

    batch, length = input_ids.shape
    real = attention_mask.bool()
    prompt_cols = length - logits_to_keep
    prompt_len = real[:, :prompt_cols].sum(1)
    rest = [input_ids[b][real[b]][prefix_len:] for b in range(batch)]
    width = max(len(r) for r in rest)
    ids = input_ids.new_zeros((batch, width))
    for b, r in enumerate(rest):
        ids[b, :len(r)] = r
    scored = real[:, -logits_to_keep:]
    rows, cols = scored.nonzero(as_tuple=True)
    token_at = prompt_len[rows] - prefix_len + cols  # the token's column in `ids`; its logits are the one before's
    head = CompletionHead(positions=rows * width + token_at - 1, targets=ids[rows, token_at],
                          temperatures=temperatures.to(torch.float32)[rows], entropy=entropy)
    out = model(input_ids=ids, cache=prefix_cache, completion_head=head)
    return in_layout(out, rows, cols, (batch, logits_to_keep))


def prefixed_logprobs(prefixes: SharedPrefixes, model, input_ids, attention_mask, logits_to_keep: int, temperatures,
                      *, entropy: bool = False):
    """`logprobs.completion_logprobs` of one chunk of rows, in the same layout: the rows that start with one of
    the update's shared prefixes continue from its keys and values (`completion_logprobs_after`), a group per
    prefix; the others, and every row when nothing is shared or no gradient is taken (a reference model's
    log-probs), are scored whole."""
    import torch

    from sage.engines.train.logprobs import completion_logprobs

    if not (prefixes.prefixes and torch.is_grad_enabled() and model.training):
        return completion_logprobs(model, input_ids, attention_mask, logits_to_keep, temperatures, entropy=entropy)
    prompt_cols = input_ids.size(1) - logits_to_keep
    groups: dict = {}
    for b in range(input_ids.size(0)):
        prompt = input_ids[b, :prompt_cols][attention_mask[b, :prompt_cols].bool()].tolist()
        groups.setdefault(prefixes.match(prompt), []).append(b)
    if list(groups) == [None]:
        return completion_logprobs(model, input_ids, attention_mask, logits_to_keep, temperatures, entropy=entropy)
    shape = (input_ids.size(0), logits_to_keep)
    log_probs = torch.zeros(shape, dtype=torch.float32, device=input_ids.device)
    entropies = torch.zeros(shape, dtype=torch.float32, device=input_ids.device) if entropy else None
    for prefix, members in groups.items():
        at = torch.tensor(members, device=input_ids.device)
        args = (input_ids[at], attention_mask[at], logits_to_keep, temperatures[at])
        if prefix is None:
            lp, ent = completion_logprobs(model, *args, entropy=entropy)
        else:
            cache = prefixes.cache(model, prefix, len(members), input_ids.device)
            lp, ent = completion_logprobs_after(model, cache, len(prefix), *args, entropy=entropy)
        log_probs = log_probs.index_put((at,), lp.float())
        if entropies is not None:
            entropies = entropies.index_put((at,), ent.float())
    return log_probs, entropies
