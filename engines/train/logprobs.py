"""Log-probs of the completion tokens, each at its own row's sampling temperature (`add_completion_head`,
`completion_logprobs`).

Every role samples at its own temperature, so one update mixes rows whose policies are `softmax(logits / T_row)`
for different T, while TRL's fused LM head divides every logit by one temperature fixed when the trainer is built.
This head projects only the completion tokens that exist (no prompt position, no padding) and scores them once
per distinct temperature, dividing the logits themselves by T (exact for a bias and a final soft-cap): through
TRL's chunked kernel (`ChunkedLogProbFunction`) on GPUs and for soft-capped heads, elsewhere through
`TokenChunkedLogProbs` (a chunk of tokens at a time over the whole vocabulary, in the head's dtype). The entropy,
which TRL logs but never differentiates here, is computed only when asked for.

The head is a keyword of the causal LM's own `forward` (`completion_head=CompletionHead(...)`), so the call goes
through whatever wraps the model (PEFT, DDP, FSDP, DeepSpeed) as TRL's fused head does.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from trl.kernels.chunked_logprob import ChunkedLogProbFunction, _use_triton
from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, maybe_gather_lm_head_ctx

from sage.engines.train.attention import packs

#: Config fields of model families whose LM head multiplies its logits by a constant; TRL's kernel takes that
#: scale, this head does not (the supported heads are plain linear projections, optionally soft-capped).
_LOGIT_SCALE_FIELDS = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
#: Elements of one token chunk's float32 logits in `TokenChunkedLogProbs` (64 MiB): 341 tokens of a
#: 49k vocabulary, so a CPU micro-batch of one row is one chunk.
_CHUNK_ELEMENTS = 1 << 24


@dataclass
class CompletionHead:
    """What to score in one forward pass: `positions` index the flattened (batch x length) hidden states whose
    next token is `targets` (both 1-D, one entry per scored token), each at temperature `temperatures`."""

    positions: torch.Tensor
    targets: torch.Tensor
    temperatures: torch.Tensor
    entropy: bool = False


def add_completion_head(model) -> None:
    """Give `model` (a causal LM, the base model under PEFT) the `completion_head` keyword on `forward`, which
    then returns (log-probs [N] float32, entropies [N] or None) of the head's tokens.

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
    """Whether to score through TRL's `ChunkedLogProbFunction` rather than `TokenChunkedLogProbs`: where it is a
    fused Triton kernel (GPUs), and for soft-capped heads. Without Triton TRL falls back to torch ops that upcast
    the head and its gradient GEMM to float32 tile by tile, about half the speed on a CPU (docs/performance.md)."""
    return softcap is not None or _use_triton(device)


def _score(hidden, lm_head, head: CompletionHead, softcap):
    """Log-probs (and entropies, or None) of `head.targets` given `hidden` [N, H], one kernel call per
    temperature."""
    weight, bias = lm_head.weight, lm_head.bias
    if isinstance(weight, DTensor):  # FSDP2 shards the head; the hidden states are a plain tensor
        weight = weight.full_tensor()
        bias = bias.full_tensor() if bias is not None else None
    hidden = hidden.to(weight.device)
    targets, temperatures = head.targets.to(weight.device), head.temperatures.to(weight.device)
    # Connected to the model even when nothing is scored (a micro-batch of padding rows): backward still works.
    log_probs = hidden[:, 0].float() * 0
    entropy = hidden.new_zeros(targets.shape, dtype=torch.float32) if head.entropy else None
    fused = use_trl_kernel(hidden.device, softcap)
    with maybe_gather_lm_head_ctx(weight, bias):
        for t in torch.unique(temperatures).tolist():
            sel = (temperatures == t).nonzero()[:, 0]
            if fused:
                lp, ent = trl_chunked_logprobs(hidden[sel], weight, bias, targets[sel], float(t), softcap,
                                               head.entropy)
            else:
                lp, ent = token_chunked_logprobs(hidden[sel], weight, bias, targets[sel], float(t), head.entropy)
            log_probs = log_probs.index_put((sel,), lp)
            if entropy is not None:
                entropy = entropy.index_put((sel,), ent)
    return log_probs, entropy


def trl_chunked_logprobs(hidden, weight, bias, targets, temperature: float, softcap=None, entropy: bool = False):
    """The same as `token_chunked_logprobs` through TRL's `ChunkedLogProbFunction` (its chunk size), which takes a
    soft-capped head too: fused Triton on GPUs, float32 torch ops elsewhere."""
    outputs = ("log_probs", "entropy") if entropy else ("log_probs",)
    lp, ent, *_ = ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature,
                                               _CHUNKED_LOGPROB_CHUNK_SIZE, softcap, 1.0, outputs)
    return lp, ent if entropy else None


def token_chunked_logprobs(hidden, weight, bias, targets, temperature: float, entropy: bool = False):
    """`log_softmax((hidden @ weight.T + bias) / temperature)[targets]` [N] in float32, and the entropies [N] (not
    differentiable) when `entropy`, else None (`TokenChunkedLogProbs`)."""
    return TokenChunkedLogProbs.apply(hidden, weight, bias, targets, 1.0 / temperature, entropy)


def _logits(h, weight, bias, inv_t):
    z = torch.mm(h.to(weight.dtype), weight.t())
    if bias is not None:
        z = z + bias
    return z.float() * inv_t


class TokenChunkedLogProbs(torch.autograd.Function):
    """The whole vocabulary of a chunk of tokens at once, in the head's dtype; the float32 logits are never kept:
    backward recomputes them chunk by chunk (at most `_CHUNK_ELEMENTS` of them)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_t, entropy):
        ctx.set_materialize_grads(False)
        chunk = max(1, _CHUNK_ELEMENTS // weight.size(0))
        log_z = hidden.new_empty(hidden.size(0), dtype=torch.float32)
        log_probs = torch.empty_like(log_z)
        ent = torch.empty_like(log_z) if entropy else None
        for s in range(0, hidden.size(0), chunk):
            z = _logits(hidden[s:s + chunk], weight, bias, inv_t)
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
            grad_z = torch.exp(_logits(h, weight, bias, ctx.inv_t) - log_z[s:s + ctx.chunk, None])
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


def completion_logprobs(model, input_ids, attention_mask, logits_to_keep: int, temperatures, *,
                        entropy: bool = False):
    """Per-token log-probs [B, logits_to_keep] of the last `logits_to_keep` tokens of `input_ids` (the
    completions, right-padded after left-padded prompts; zeros where `attention_mask` is 0), row b at
    temperature `temperatures[b]`, in one forward pass of `model` (patched by `add_completion_head`, possibly
    wrapped); also the entropies [B, logits_to_keep] when `entropy`, else None.

    The rows' real tokens go right-aligned into a batch as wide as the longest row (TRL's layout pads every row
    to the longest prompt plus the longest completion), or packed end to end into one sequence where the
    model's attention takes packed rows (`attention.packs`): each row then restarts its position ids and
    attends to its own tokens only (`cu_seq_lens_q`), and the linear layers run one matrix of all the rows'
    tokens instead of a padded batch."""
    batch, length = input_ids.shape
    real = attention_mask.bool()
    rows, cols = real[:, -logits_to_keep:].nonzero(as_tuple=True)
    at = length - logits_to_keep + cols  # the scored tokens' columns in `input_ids`
    n = real.sum(1)
    rank = real.cumsum(1) - 1  # a real token's index in its row
    temps = temperatures.to(torch.float32)[rows]
    if batch > 1 and packs(model):
        ends = n.cumsum(0)
        starts = ends - n
        ids = input_ids[real][None]  # row by row, each row's tokens in order
        position_ids = (torch.arange(ids.size(1), device=ids.device) - starts.repeat_interleave(n))[None]
        token_at = starts[rows] + rank[rows, at]  # its logits are the one before's
        head = CompletionHead(positions=token_at - 1, targets=ids[0, token_at], temperatures=temps, entropy=entropy)
        cu = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)
        longest = int(n.max())
        lp, ent = model(input_ids=ids, position_ids=position_ids, completion_head=head, cu_seq_lens_q=cu,
                        cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    else:
        width = int(n.max())
        new_col = (width - n)[:, None] + rank  # right-aligned
        r, c = real.nonzero(as_tuple=True)
        ids = input_ids.new_zeros((batch, width)).index_put((r, new_col[r, c]), input_ids[r, c])
        mask = attention_mask.new_zeros((batch, width)).index_put((r, new_col[r, c]), attention_mask.new_ones(r.shape))
        token_at = new_col[rows, at]  # its logits are the one before's
        head = CompletionHead(positions=rows * width + token_at - 1, targets=ids[rows, token_at], temperatures=temps,
                              entropy=entropy)
        lp, ent = model(input_ids=ids, attention_mask=mask, completion_head=head)
    shape = (batch, logits_to_keep)  # back to TRL's layout, zeros where nothing is scored
    log_probs = lp.new_zeros(shape).index_put((rows, cols), lp)
    return log_probs, (ent.new_zeros(shape).index_put((rows, cols), ent) if ent is not None else None)
