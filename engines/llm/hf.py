"""transformers backend: our own batched decode loop over a transformers model (CPU or one GPU).

Why not `model.generate`: it cannot give each row its own seed (sampling would depend on what else is in
the batch) and on a CPU it spends most of its time outside the matmuls (mask building, cache `cat`s).
This loop keeps what matters of it and adds what the pipeline needs:

- Requests are expanded to one row per sample, sorted by length (longest first) and packed into batches of
  at most `model.token_budget` padded tokens (rows x (prompt + max new tokens)); prompts are left-padded
  and rendered with the tokenizer's chat template. On the fast path the rows of one prompt (a request's n
  samples) prefill it once and copy its keys and values, and a prefix every prompt of the batch shares (the
  role's instructions and worked example: 158 of validation's ~183 tokens a prompt) is prefilled once for
  the whole batch (at least `SHARED_PREFIX_MIN` tokens; `layout`).
- Llama-style decoders (llama, qwen2, qwen3, mistral without a sliding window) run a fast path: the
  model's layers with fused q/k/v and gate/up matmuls (`engines/llm/hf_fast.py`; LoRA adapters added
  unmerged, others through the model's own modules), a preallocated KV cache written in place, attention
  over the filled part only, the lm_head on the last position only; rows that finished are dropped from
  the batch when a quarter of it is done. Any other architecture runs the model's `forward` with a
  `DynamicCache`, same sampling.
- An adapter computes in the dtype it trains in (`adapter_compute_dtype`): under a bf16 base in bf16, as the
  trainer's autocast and vLLM do, so generation samples from the policy the trainer trains.
- Sampling is per row and independent of the batch: completion j of a request draws, at step t, one
  uniform from a hash of (sample_seed(seed, j), t) and takes the inverse CDF of the (top-p truncated,
  grammar masked, temperature scaled) distribution. That is an exact sample, like Gumbel-max, but needs
  one random number per step instead of one per vocabulary entry. Temperature 0 is argmax. Same request +
  seed => same tokens, whatever else is in the batch, up to float rounding in batched matmuls (exact in
  practice in fp32). In bf16 that rounding is large enough to flip greedy tokens: a shared prefix prefilled
  once rounds differently from whole prompts, and 17 of 65 SmolLM2 validation answers changed somewhere
  (none in fp32; validation accuracy on 300 problems within 1% either way, docs/performance.md). The argmax
  and the inverse CDF search blocks of the vocabulary (`engines/llm/sampling.py`), faster on a CPU than
  `torch.argmax` / a full `cumsum`.
- `regex` requests are constrained with xgrammar: one `GrammarMatcher` per row, token bitmasks applied to
  the logits; compiled grammars are cached by regex.
- Log-probs: `log_softmax(logits / temperature)[token]`, see `engines/llm/base.py`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
from dataclasses import dataclass, field

import torch

from sage.configs.schema import ModelConfig
from sage.engines.llm.base import Completion, GenRequest, GenResult, ProgressFn, sample_seed
from sage.engines.llm.hf_fast import FusedDecoder, module_layer
from sage.engines.llm.models import adapter_compute_dtype, quiet_v6, resolve_dtype, resolve_model, trim_heap
from sage.engines.llm.sampling import argmax, draw, log_normalizer, uniform

FAST_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral"}

# The fewest tokens of a batch-wide shared prompt prefix worth a prefill pass of its own: shorter ones save
# less than that pass's fixed cost (and a chat template's system header alone is ~15-20 tokens).
SHARED_PREFIX_MIN = 32


@dataclass
class Row:
    """One sample of a request: its prompt, sampling settings and what it has generated so far."""

    request: int
    index: int
    prompt_ids: list[int]
    max_new: int
    temperature: float
    top_p: float
    seed: int
    regex: str | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    matcher: object = None


def batches(rows: list[Row], token_budget: int):
    """`rows` longest first (prompt + most new tokens), in batches of at most `token_budget` padded tokens."""
    rows = sorted(rows, key=lambda r: (-(len(r.prompt_ids) + r.max_new), r.request, r.index))
    batch, width = [], 0
    for row in rows:
        w = max(width, len(row.prompt_ids) + row.max_new)
        if batch and (len(batch) + 1) * w > token_budget:
            yield batch
            batch, w = [], len(row.prompt_ids) + row.max_new
        batch.append(row)
        width = w
    if batch:
        yield batch


def layout(rows: list[Row], P: int, N: int, pad_id: int, share: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The batch's prompt ids (B, P), its key mask (B, P + N), and the length of the prefix its prompts
    share in slots [0, shared).

    Prompts are left-padded to P. When the distinct prompts of the batch share a prefix of at least
    `SHARED_PREFIX_MIN` tokens (with `share`: the backend's fast path), it goes first in every row and the
    padding goes between it and the rest, `[prefix][padding][rest]`, so its keys and values sit in the same
    slots of every row and one pass computes them for all (`HFLLM._prefill`). Positions follow the unpadded
    tokens, so each row's tokens keep the positions they have alone; the prefix keeps at least one token of
    each prompt out of it (the pass over the rest gives each row's next-token logits)."""
    shared = 0
    if share and len({tuple(r.prompt_ids) for r in rows}) > 1:
        shared = min(len(os.path.commonprefix([r.prompt_ids for r in rows])),
                     min(len(r.prompt_ids) for r in rows) - 1)
        shared = shared if shared >= SHARED_PREFIX_MIN else 0
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    keymask = torch.zeros((len(rows), P + N), dtype=torch.bool)
    if shared:
        ids[:, :shared] = torch.tensor(rows[0].prompt_ids[:shared])
        keymask[:, :shared] = True
    for b, r in enumerate(rows):
        rest = r.prompt_ids[shared:]
        ids[b, P - len(rest):] = torch.tensor(rest)
        keymask[b, P - len(rest):] = True
    return ids, keymask, shared


class HFLLM:
    """The `hf` backend; see the module docstring."""

    def __init__(self, cfg: ModelConfig, device: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.model_name = cfg.name
        self.adapter: str | None = None
        self.path = resolve_model(cfg.name, cfg.cache_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {cfg.name!r} has no chat template; use an instruct/chat model")
        self.base = AutoModelForCausalLM.from_pretrained(self.path, dtype=self.dtype).to(self.device).eval()
        self._peft = None
        config = self.base.config
        eos = self.base.generation_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        if not eos:
            raise ValueError(f"{cfg.name!r} defines no EOS token; generation could not stop")
        self.eos_ids = sorted(set(eos))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.vocab_size = config.vocab_size
        self.fast = config.model_type in FAST_MODEL_TYPES and not self._sliding(config)
        self._cache_kw = "cache" if "cache" in inspect.signature(self.base.forward).parameters else "past_key_values"
        self._compiler = None
        self._grammars: dict[str, object] = {}
        # Fused layers on CPUs only: their bit-identity with the modules was checked on oneDNN, not on cuBLAS,
        # whose kernel choice depends on the matmul shape. None or not _fused_ok: the model's own modules.
        fuse = self.fast and self.device.type == "cpu"
        self._fused = FusedDecoder.build(self.base, self.dtype, self.device) if fuse else None
        self._fused_ok = self._fused is not None

    @staticmethod
    def _sliding(config) -> bool:
        window = getattr(config, "sliding_window", None)
        return bool(window) and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings

    # ---- public API -------------------------------------------------------------------------------------

    def generate(self, requests: list[GenRequest], progress: ProgressFn | None = None) -> list[GenResult]:
        results, rows = [], []
        for i, req in enumerate(requests):
            text = self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            room = self.cfg.max_model_len - len(ids)
            if room < 1:
                raise ValueError(f"request {i}: prompt has {len(ids)} tokens, model.max_model_len is "
                                 f"{self.cfg.max_model_len}; raise model.max_model_len or shorten the prompt")
            results.append(GenResult(prompt_text=text, prompt_ids=list(ids), completions=[None] * req.n))
            for j in range(req.n):
                rows.append(Row(i, j, list(ids), min(req.max_new_tokens, room), req.temperature, req.top_p,
                                 sample_seed(req.seed, j), req.regex_for(j)))
        left = [req.n for req in requests]
        done, new_tokens = 0, 0
        for batch in batches(rows, self.cfg.token_budget):
            for row in batch:
                if row.regex is not None:
                    row.matcher = self._matcher(row.regex)
            new_tokens += self._run_batch(batch)
            for row in batch:
                results[row.request].completions[row.index] = self._completion(row)
                left[row.request] -= 1
                done += left[row.request] == 0
            if progress is not None:
                progress(done, len(requests), new_tokens)
        return results

    def use_adapter(self, path: str | None) -> None:
        """Load the PEFT adapter at `path` onto the base model (replacing any other); None: base model."""
        if self._peft is not None:
            self.base = self._peft.unload()  # removes the LoRA layers without merging: base weights untouched
            self._peft = None
            self.adapter = None
        if path is not None:
            from peft import PeftModel

            with quiet_v6():
                self._peft = PeftModel.from_pretrained(self.base, str(path), is_trainable=False).eval()
            self.adapter = str(path)
        if self._fused is not None:
            self._fused_ok = self._fused.set_lora()

    def close(self) -> None:
        self._peft = self.base = self._fused = None
        gc.collect()
        trim_heap()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ---- batching -----------------------------------------------------------------------------------

    def _completion(self, row: Row) -> Completion:
        body = row.tokens[:-1] if row.finish == "stop" and row.tokens and row.tokens[-1] in self.eos_ids \
            else row.tokens
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        return Completion(text=text, token_ids=list(row.tokens), logprobs=list(row.logprobs),
                          finish_reason=row.finish or "length")

    # ---- grammar --------------------------------------------------------------------------------------

    def _matcher(self, regex: str):
        import xgrammar as xgr

        if regex not in self._grammars:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.eos_ids)
                self._compiler = xgr.GrammarCompiler(info)
            self._grammars[regex] = self._compiler.compile_regex(regex)
        return xgr.GrammarMatcher(self._grammars[regex])

    # ---- decode loop ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def _run_batch(self, rows: list[Row]) -> int:
        dev = self.device
        B, P = len(rows), max(len(r.prompt_ids) for r in rows)
        N = max(r.max_new for r in rows)
        ids, keymask, shared = layout(rows, P, N, self.pad_id, share=self.fast)
        ids, keymask = ids.to(dev), keymask.to(dev)
        lens = keymask[:, :P].sum(-1)
        live = list(range(B))  # rows[live[k]] is batch row k
        state = self._new_state(B, P + N)
        positions = (keymask[:, :P].cumsum(-1) - 1).clamp(min=0)
        # as in transformers: no padding, no mask (so no row ever needs one; a pass after a shared prefix
        # builds its causal mask itself)
        if self.fast and bool(keymask.all()):
            keymask = None
        logits = self._prefill(ids, positions, keymask, state, P, shared)
        produced = 0
        for t in range(N):
            tokens, logprobs = self._sample(logits, [rows[b] for b in live], t)
            produced += len(live)
            for k, b in enumerate(live):
                self._accept(rows[b], tokens[k], logprobs[k])
            keep = [k for k, b in enumerate(live) if rows[b].finish is None]
            if not keep:
                break
            if self.fast and len(keep) <= 0.75 * len(live):
                idx = torch.tensor(keep, device=dev)
                state = [(kc.index_select(0, idx), vc.index_select(0, idx)) for kc, vc in state]
                keymask = keymask[idx] if keymask is not None else None
                lens, tokens = lens[idx], [tokens[k] for k in keep]
                live = [live[k] for k in keep]
            step_ids = torch.tensor(tokens, device=dev).view(-1, 1)
            logits = self._forward(step_ids, (lens + t).view(-1, 1), keymask, state, P + t, P + t + 1)
        return produced

    def _prefill(self, ids, positions, keymask, state, P: int, shared: int = 0) -> torch.Tensor:
        """The prompts' forward pass into cache slots [0, P): logits of each row's last prompt position. On the
        fast path rows with the same prompt (the samples of one request, adjacent in a batch) are run once and
        their keys, values and logits copied to each: a request of n samples prefills once, not n times. A
        prefix all rows share (slots [0, shared), see `layout`) runs once, for one row, and its keys and values
        are copied to every row; the rest of each prompt then attends to them from the cache."""
        if not self.fast:
            return self._forward(ids, positions, keymask, state, 0, P)
        # a prompt is its laid-out ids with their key mask: after a shared prefix the padding sits mid-row, so
        # prefix + [pad id] + rest and prefix + rest lay out to the same ids and differ only in the mask
        first: dict[tuple, int] = {}  # laid-out prompt -> its index in `uniq`
        uniq, owner = [], []  # the first row of each prompt; each row's prompt
        masks = [()] * len(ids) if keymask is None else keymask[:, :P].tolist()
        for b, row in enumerate(ids.tolist()):
            owner.append(first.setdefault((tuple(row), tuple(masks[b])), len(uniq)))
            if owner[-1] == len(uniq):
                uniq.append(b)
        distinct = len(uniq) == len(owner)
        if not distinct:
            uniq = torch.tensor(uniq, device=ids.device)
            ids, positions = ids[uniq], positions[uniq]
            keymask = None if keymask is None else keymask[uniq]
        once = state if distinct else self._new_state(len(uniq), P)
        if shared:
            prefix = self._new_state(1, shared)
            self._forward(ids[:1, :shared], positions[:1, :shared], None, prefix, 0, shared)
            for (kc, vc), (k1, v1) in zip(once, prefix):
                kc[:, :, :shared] = k1
                vc[:, :, :shared] = v1
        logits = self._forward(ids[:, shared:], positions[:, shared:], keymask, once, shared, P)
        if distinct:
            return logits
        rows = torch.tensor(owner, device=ids.device)
        for (kc, vc), (k1, v1) in zip(state, once):
            kc[:, :, :P] = k1.index_select(0, rows)
            vc[:, :, :P] = v1.index_select(0, rows)
        return logits.index_select(0, rows)

    def _accept(self, row: Row, token: int, logprob: float) -> None:
        if row.finish is not None:
            return
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if row.matcher is not None and (not row.matcher.accept_token(token) or row.matcher.is_terminated()):
            row.finish = "stop"
        elif token in self.eos_ids:
            row.finish = "stop"
        elif len(row.tokens) >= row.max_new:
            row.finish = "length"

    def _sample(self, logits: torch.Tensor, rows: list[Row], step: int) -> tuple[list[int], list[float]]:
        """Next token of every row, and its log-prob under the row's sampling temperature (1 when greedy)."""
        logits = logits.float()
        constrained = [k for k, r in enumerate(rows) if r.matcher is not None and r.finish is None]
        scores = logits.clone() if constrained else logits  # the mask must not reach the log-probs
        if constrained:
            import xgrammar as xgr

            bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab_size)
            for k in constrained:
                rows[k].matcher.fill_next_token_bitmask(bitmask, k)
            xgr.apply_token_bitmask_inplace(scores, bitmask.to(scores.device), indices=constrained)
        out = argmax(scores)
        sampled = [k for k, r in enumerate(rows) if r.temperature > 0 and r.finish is None]
        if sampled:
            picked = [rows[k] for k in sampled]
            idx = torch.tensor(sampled, device=out.device)
            out[idx] = draw(scores[idx] if len(sampled) < len(rows) else scores, [r.temperature for r in picked],
                            [r.top_p for r in picked], [uniform(r.seed, step) for r in picked])
        if any(r.temperature not in (0.0, 1.0) for r in rows):
            temps = torch.tensor([r.temperature or 1.0 for r in rows], device=logits.device).view(-1, 1)
            logits = logits / temps
        logprobs = logits.gather(-1, out.view(-1, 1)).view(-1) - log_normalizer(logits)
        return out.tolist(), logprobs.tolist()

    # ---- model forward --------------------------------------------------------------------------------

    def _new_state(self, batch: int, length: int):
        if not self.fast:
            from transformers import DynamicCache

            return DynamicCache()
        c = self.base.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        shape = (batch, c.num_key_value_heads, length, head_dim)
        return [(torch.empty(shape, dtype=self.dtype, device=self.device),
                 torch.empty(shape, dtype=self.dtype, device=self.device)) for _ in range(c.num_hidden_layers)]

    def _forward(self, ids, positions, keymask, state, start: int, end: int) -> torch.Tensor:
        """Logits (model dtype) of the last position, for `ids` written at cache slots [start, end)."""
        with self._adapter_autocast():
            return self._forward_layers(ids, positions, keymask, state, start, end)

    def _adapter_autocast(self):
        """An adapter computes in `adapter_compute_dtype` of the base, as in training. The fused layers do that
        themselves; the model's own modules, under a bf16 base, run under the trainer's autocast, with PEFT's
        cast of every LoRA input to float32 off (`peft.helpers.disable_input_dtype_casting`)."""
        dtype = adapter_compute_dtype(self.dtype)
        if self._peft is None or self._fused_ok or dtype is None:
            return contextlib.nullcontext()
        from peft.helpers import disable_input_dtype_casting

        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(self.device.type, dtype=dtype))
        stack.enter_context(disable_input_dtype_casting(self._peft))
        return stack

    def _forward_layers(self, ids, positions, keymask, state, start: int, end: int) -> torch.Tensor:
        if not self.fast:
            out = self.base(input_ids=ids, attention_mask=keymask[:, :end].long(), position_ids=positions,
                            use_cache=True, logits_to_keep=1, **{self._cache_kw: state})
            return out.logits[:, -1]
        decoder = self.base.get_decoder()
        h = decoder.embed_tokens(ids)
        cos, sin = decoder.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, T, 1, hd): q/k stay (B, T, heads, hd)
        T = ids.shape[1]
        if T > 1 and (keymask is not None or start > 0):
            # prefill: causal (query i is slot start + i) + padding mask; a padding row attends to itself so it
            # never sees no key
            causal = torch.ones(T, end, dtype=torch.bool, device=ids.device).tril(start)
            mask = causal[None, None] if keymask is None else causal[None, None] & keymask[:, None, None, :end]
            own = torch.zeros(T, end, dtype=torch.bool, device=ids.device)
            own[:, start:] = torch.eye(T, dtype=torch.bool, device=ids.device)
            mask = mask | own
        elif keymask is None:
            mask = None
        else:
            mask = keymask[:, None, None, :end]
        if mask is not None:  # SDPA turns a boolean mask into this additive one on every call; once per step
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill_(~mask, float("-inf"))
        layers = self._fused.layers if self._fused_ok else \
            [functools.partial(module_layer, layer) for layer in decoder.layers]
        for layer, (kc, vc) in zip(layers, state):
            h = layer(h, cos, sin, kc, vc, start, end, mask)
        if self._fused_ok:
            logits = self._fused.logits(self._fused.norm(h[:, -1:]))
        else:
            logits = self.base.get_output_embeddings()(decoder.norm(h[:, -1:]))
        return logits[:, -1]
