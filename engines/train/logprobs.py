"""Log-probs of the completion tokens, each at its own row's sampling temperature, through the model's LM head
in chunks (`add_completion_head`, `completion_logprobs`).

Every role samples at its own temperature (`roles.<role>.temperature`), so one update mixes rows whose
policies are `softmax(logits / T_row)` for different T. TRL's fused LM head divides every logit by one
temperature fixed when the trainer is built. This head takes a temperature per scored token instead: it
projects only the completion tokens that exist (no prompt position, no padding; TRL's head on a device without
Triton projects every position of the batch through the full vocabulary) and scores them once per distinct
temperature, with that temperature: on GPUs (and for soft-capped heads) through TRL's chunked log-prob kernel
(`ChunkedLogProbFunction`, which never materialises the tokens x vocabulary logits), elsewhere through
`token_chunked_logprobs` (the whole vocabulary for a chunk of tokens at a time, in the head's dtype, float32
logits recomputed in backward instead of kept). Both divide the logits themselves by T, so this is exact for
every head they support (a bias, a final soft-cap), not an approximation through the hidden states. The entropy,
which TRL logs but never differentiates here, is computed only when asked for.

The head is a keyword of the causal LM's own `forward` (`completion_head=CompletionHead(...)`), so the call
goes through whatever wraps the model (PEFT, DDP, FSDP, DeepSpeed) exactly as TRL's fused head does;
without the keyword the forward is the previous one, untouched.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

from sage.engines.train.attention import packs

#: Config fields of model families whose LM head multiplies its logits by a constant; TRL's kernel takes that
#: scale, this head does not (the supported heads are plain linear projections, optionally soft-capped).
_LOGIT_SCALE_FIELDS = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


@dataclass
class CompletionHead:
    """What to score in one forward pass: `positions` index the flattened (batch x length) hidden states whose
    next token is `targets` (both 1-D, one entry per scored token), each at temperature `temperatures`."""

    positions: object  # torch.LongTensor [N]
    targets: object  # torch.LongTensor [N]
    temperatures: object  # torch.FloatTensor [N]
    entropy: bool = False


@dataclass
class CompletionOutput:
    log_probs: object  # [N], float32, differentiable
    entropy: object = None  # [N] or None


def add_completion_head(model) -> None:
    """Give `model` (a causal LM, the base model under PEFT) the `completion_head` keyword on `forward`.

    Raises ValueError for a head this module cannot score exactly (a constant logit scale)."""
    text_config = model.config.get_text_config()
    scaled = [f for f in _LOGIT_SCALE_FIELDS if getattr(text_config, f, None) not in (None, 1, 1.0)]
    if scaled:
        raise ValueError(f"{type(model).__name__} scales its logits ({', '.join(scaled)}); the stored-rows trainer "
                         "supports LM heads that are a plain linear projection (Llama, Qwen, Mistral, SmolLM)")
    softcap = getattr(text_config, "final_logit_softcapping", None)
    previous = model.forward

    @functools.wraps(type(model).forward)  # `generate` checks its keyword arguments against this signature
    def forward(self, *args, completion_head: CompletionHead | None = None, **kwargs):
        if completion_head is None:
            return previous(*args, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state  # the backbone, final norm included
        hidden = hidden.reshape(-1, hidden.size(-1))[completion_head.positions]
        return _score(hidden, self.get_output_embeddings(), completion_head, softcap)

    model.forward = types.MethodType(forward, model)


def use_trl_kernel(device, softcap) -> bool:
    """Whether to score through TRL's `ChunkedLogProbFunction` rather than `token_chunked_logprobs`: where it is a
    fused Triton kernel (GPUs), and for soft-capped heads. Without Triton TRL falls back to torch ops that upcast
    the head and its gradient GEMM to float32 tile by tile, about half the speed on a CPU (docs/performance.md)."""
    from trl.kernels.chunked_logprob import _use_triton

    return softcap is not None or _use_triton(device)


def _score(hidden, lm_head, head: CompletionHead, softcap) -> CompletionOutput:
    """Log-probs (and entropies) of `head.targets` given `hidden` [N, H], one kernel call per temperature."""
    import torch
    from torch.distributed.tensor import DTensor
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, maybe_gather_lm_head_ctx

    weight, bias = lm_head.weight, lm_head.bias
    if isinstance(weight, DTensor):  # FSDP2 shards the head; the hidden states are a plain tensor
        weight = weight.full_tensor()
        bias = bias.full_tensor() if bias is not None else None
    hidden = hidden.to(weight.device)
    targets, temperatures = head.targets.to(weight.device), head.temperatures.to(weight.device)
    outputs = ("log_probs", "entropy") if head.entropy else ("log_probs",)
    # Connected to the model even when nothing is scored (a micro-batch of padding rows): backward still works.
    log_probs = hidden[:, 0].float() * 0
    entropy = hidden.new_zeros(targets.shape, dtype=torch.float32) if head.entropy else None
    fused = use_trl_kernel(hidden.device, softcap)
    with maybe_gather_lm_head_ctx(weight, bias):
        for t in torch.unique(temperatures).tolist():
            sel = (temperatures == t).nonzero()[:, 0]
            if fused:
                lp, ent, *_ = ChunkedLogProbFunction.apply(hidden[sel], weight, bias, targets[sel], float(t),
                                                           _CHUNKED_LOGPROB_CHUNK_SIZE, softcap, 1.0, outputs)
            else:
                lp, ent = token_chunked_logprobs(hidden[sel], weight, bias, targets[sel], float(t), head.entropy)
            log_probs = log_probs.index_put((sel,), lp)
            if entropy is not None:
                entropy = entropy.index_put((sel,), ent)
    return CompletionOutput(log_probs=log_probs, entropy=entropy)


#: Elements of one token chunk's float32 logits in `token_chunked_logprobs` (64 MiB): 341 tokens of a
#: 49k vocabulary, so a CPU micro-batch of one row is one chunk.
_CHUNK_ELEMENTS = 1 << 24


def token_chunked_logprobs(hidden, weight, bias, targets, temperature: float, entropy: bool = False):
    """`log_softmax((hidden @ weight.T + bias) / temperature)[targets]` [N] in float32, and the entropies [N] (not
    differentiable) when `entropy`: the whole vocabulary of a chunk of tokens at once, in the head's dtype, the
    float32 logits never kept: backward recomputes them chunk by chunk (at most `_CHUNK_ELEMENTS` of them)."""
    return _token_chunked_class().apply(hidden, weight, bias, targets, 1.0 / temperature, entropy)


_TOKEN_CHUNKED = None


def _token_chunked_class():
    global _TOKEN_CHUNKED
    if _TOKEN_CHUNKED is not None:
        return _TOKEN_CHUNKED
    import torch

    def logits(h, weight, bias, inv_t):
        z = torch.mm(h.to(weight.dtype), weight.t())
        if bias is not None:
            z = z + bias
        return z.float() * inv_t

    class TokenChunkedLogProbs(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, bias, targets, inv_t, entropy):
            ctx.set_materialize_grads(False)
            chunk = max(1, _CHUNK_ELEMENTS // weight.size(0))
            log_z = hidden.new_empty(hidden.size(0), dtype=torch.float32)
            log_probs = torch.empty_like(log_z)
            ent = torch.empty_like(log_z) if entropy else None
            for s in range(0, hidden.size(0), chunk):
                z = logits(hidden[s:s + chunk], weight, bias, inv_t)
                lz = log_z[s:s + chunk] = z.logsumexp(-1)
                log_probs[s:s + chunk] = z.gather(-1, targets[s:s + chunk, None])[:, 0] - lz
                if ent is not None:  # H = log Z - sum_j p_j z_j (softmax's fused kernel beats exp(z - log Z))
                    ent[s:s + chunk] = lz - (z.softmax(-1) * z).sum(-1)
            ctx.save_for_backward(hidden, weight, bias, targets, log_z)
            ctx.inv_t, ctx.chunk = inv_t, chunk
            if ent is not None:
                ctx.mark_non_differentiable(ent)
            return log_probs, ent

        @staticmethod
        def backward(ctx, grad_log_probs, grad_entropy):
            hidden, weight, bias, targets, log_z = ctx.saved_tensors
            needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
            if grad_log_probs is None:
                return None, None, None, None, None, None
            grad_hidden = torch.empty_like(hidden) if needs_hidden else None
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_weight else None
            grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if needs_bias else None
            rows = torch.arange(min(ctx.chunk, hidden.size(0)), device=hidden.device)
            for s in range(0, hidden.size(0), ctx.chunk):
                h, g = hidden[s:s + ctx.chunk], grad_log_probs[s:s + ctx.chunk].float()
                # d log p_target / dz_j = 1[j = target] - p_j, times d z / d logits = 1 / T
                grad_z = torch.exp(logits(h, weight, bias, ctx.inv_t) - log_z[s:s + ctx.chunk, None])
                grad_z.mul_(-g[:, None])
                grad_z[rows[:h.size(0)], targets[s:s + ctx.chunk]] += g
                grad_z = (grad_z * ctx.inv_t).to(weight.dtype)
                if grad_hidden is not None:
                    grad_hidden[s:s + ctx.chunk] = torch.mm(grad_z, weight).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight += torch.mm(grad_z.t(), h.to(weight.dtype)).float()
                if grad_bias is not None:
                    grad_bias += grad_z.float().sum(0)
            return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                    None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None)

    _TOKEN_CHUNKED = TokenChunkedLogProbs
    return TokenChunkedLogProbs


def _contiguous(input_ids, attention_mask, pad_id: int = 0):
    """The rows' real tokens moved to the right end of a batch as wide as the longest row, and where each
    original column went: TRL's layout (left-padded prompts, then right-padded completions) pads every row to
    the longest prompt plus the longest completion; this one only to the longest prompt + completion.
    Returns (ids, mask, column map [B, L]: new column of each real token)."""
    real = attention_mask.bool()
    n = real.sum(1)
    width = int(n.max())
    new_col = (width - n)[:, None] + real.cumsum(1) - 1
    rows, cols = real.nonzero(as_tuple=True)
    ids = input_ids.new_full((input_ids.size(0), width), pad_id).index_put((rows, new_col[rows, cols]),
                                                                             input_ids[rows, cols])
    mask = attention_mask.new_zeros((input_ids.size(0), width)).index_put((rows, new_col[rows, cols]),
                                                                           attention_mask.new_ones(rows.shape))
    return ids, mask, new_col


def completion_logprobs(model, input_ids, attention_mask, logits_to_keep: int, temperatures, *,
                        entropy: bool = False):
    """Per-token log-probs [B, logits_to_keep] of the last `logits_to_keep` tokens of `input_ids` (the
    completions, right-padded after left-padded prompts; zeros where `attention_mask` is 0), row b at
    temperature `temperatures[b]`, in one forward pass of `model` (patched by `add_completion_head`, possibly
    wrapped) over the rows laid out contiguously, or packed into one sequence where the model's attention takes
    packed rows (`attention.packs`). Also the entropies [B, logits_to_keep] when `entropy`."""
    import torch

    batch, length = input_ids.shape
    scored = attention_mask[:, -logits_to_keep:].bool()
    rows, cols = scored.nonzero(as_tuple=True)
    if batch > 1 and packs(model):
        return _packed_logprobs(model, input_ids, attention_mask, rows, cols, logits_to_keep, temperatures, entropy)
    ids, mask, new_col = _contiguous(input_ids, attention_mask)
    token_at = new_col[rows, length - logits_to_keep + cols]  # the token's column; its logits are the one before's
    head = CompletionHead(positions=rows * ids.size(1) + token_at - 1, targets=ids[rows, token_at],
                          temperatures=temperatures.to(torch.float32)[rows], entropy=entropy)
    out = model(input_ids=ids, attention_mask=mask, completion_head=head)
    return in_layout(out, rows, cols, (batch, logits_to_keep))


def _packed_logprobs(model, input_ids, attention_mask, rows, cols, logits_to_keep: int, temperatures, entropy: bool):
    """`completion_logprobs` with the rows' real tokens packed end to end into one sequence, no padding: each row
    restarts its position ids and attends to its own tokens only (`cu_seq_lens_q`, which `attention.packs`
    models take), so every token's hidden state is the one it has in its row alone, and the linear layers run
    one matrix of all the rows' tokens instead of one per row or a padded batch."""
    import torch

    batch, length = input_ids.shape
    real = attention_mask.bool()
    n = real.sum(1)
    ends = n.cumsum(0)
    starts = ends - n
    ids = input_ids[real][None]  # row by row, each row's tokens in order
    rank = real.cumsum(1) - 1  # a real token's index in its row
    position_ids = (torch.arange(ids.size(1), device=ids.device) - starts.repeat_interleave(n))[None]
    token_at = starts[rows] + rank[rows, length - logits_to_keep + cols]  # its logits are the one before's
    head = CompletionHead(positions=token_at - 1, targets=ids[0, token_at],
                          temperatures=temperatures.to(torch.float32)[rows], entropy=entropy)
    cu = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)
    longest = int(n.max())
    out = model(input_ids=ids, position_ids=position_ids, completion_head=head, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                max_length_q=longest, max_length_k=longest)
    return in_layout(out, rows, cols, (batch, logits_to_keep))


def in_layout(out: CompletionOutput, rows, cols, shape: tuple[int, int]):
    """The scored tokens' log-probs (and entropies, or None) put back at (row, completion column) of a
    [B, logits_to_keep] tensor, zeros elsewhere: TRL's layout."""
    log_probs = out.log_probs.new_zeros(shape).index_put((rows, cols), out.log_probs)
    ent = out.entropy.new_zeros(shape).index_put((rows, cols), out.entropy) if out.entropy is not None else None
    return log_probs, ent
