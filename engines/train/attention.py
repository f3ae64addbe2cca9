"""Attention for training on a CPU (`use_cpu_attention`): the scores as whole matrices through bf16 matmuls, the
probabilities kept once, in the model's dtype, for the backward pass.

On a CPU, torch's `scaled_dot_product_attention` runs its flash kernel, whose backward is tiled for GPUs and runs
far below the CPU's bf16 matmul rate; transformers' `eager` attention is faster but keeps the float32 softmax
output beside its bf16 copy (three times the memory of the probabilities alone). Here each layer computes
`softmax(q k^T * scale + mask)` in the query's dtype (the CPU kernel accumulates in float32 and rounds once),
and grouped-query heads multiply their shared key and value heads directly instead of repeating them.

Registered with transformers' attention and mask interfaces as `sage_cpu_train` (masks as for `sdpa`), set on a
model only for the length of a training pass. It also takes packed rows: given `cu_seq_lens_q` (the keyword
transformers' flash attention takes: cumulative row lengths of one packed sequence, no padding) each row attends
causally to its own tokens only; `packs(model)` says whether a model's attention takes rows packed this way.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "sage_cpu_train"
_BIAS: dict = {}  # causal biases by shape (`_causal_bias`), freed when a training pass ends
#: Attention implementations that attend packed rows (`cu_seq_lens_q`) each to its own tokens.
PACKING = (NAME, "flash_attention_2", "flash_attention_3")


def _causal_bias(lq: int, lk: int, dtype, device):
    """[Lq, Lk]: 0 where query i may see key j (j <= i + Lk - Lq), the dtype's minimum elsewhere. Kept by shape:
    every layer of a forward pass asks for the same ones (a pass of packed rows, one per row length); a few
    hundred tokens make each small."""
    key = (lq, lk, dtype, device)
    if key not in _BIAS:
        if len(_BIAS) > 256:
            _BIAS.clear()
        keep = torch.ones(lq, lk, dtype=torch.bool, device=device).tril(lk - lq)
        _BIAS[key] = torch.zeros(lq, lk, dtype=dtype, device=device).masked_fill_(~keep, torch.finfo(dtype).min)
    return _BIAS[key]


def packs(model) -> bool:
    """Whether `model` (a transformers model, or a PEFT model around one) attends rows packed into one sequence
    (`cu_seq_lens_q`) each to its own tokens."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base.config, "_attn_implementation", None) in PACKING


def attention_forward(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                      cu_seq_lens_q=None, **kwargs):
    """transformers' attention signature: query [B, H, Lq, D], key and value [B, KV, Lk, D] (H a multiple of
    KV), `attention_mask` None (causal when Lq > 1 and the module is causal), a boolean keep-mask or an additive
    float mask broadcastable to [B, 1, Lq, Lk]; or, with `cu_seq_lens_q` [R + 1], one sequence of R packed rows
    (B = 1, Lq = Lk), each attending causally to its own tokens (the mask is not read). Returns
    ([B, Lq, H, D], None)."""
    if cu_seq_lens_q is not None:
        bounds = cu_seq_lens_q.tolist()
        if query.size(0) != 1 or query.size(2) != key.size(2) or bounds[-1] != query.size(2):
            raise ValueError(f"packed rows need one sequence without a cache whose length is the rows' total; got "
                             f"query {tuple(query.shape)}, key {tuple(key.shape)}, rows ending at {bounds[-1]}")
        return torch.cat([_attend(module, query[:, :, a:e], key[:, :, a:e], value[:, :, a:e], None, scaling,
                                  dropout) for a, e in zip(bounds, bounds[1:])], dim=1), None
    return _attend(module, query, key, value, attention_mask, scaling, dropout), None


def _attend(module, query, key, value, attention_mask, scaling: float, dropout: float):
    """`attention_forward` for one batch of rows: [B, Lq, H, D]."""
    b, h, lq, d = query.shape
    kv, lk = key.size(1), key.size(2)
    g = h // kv
    # Heads h = k * g .. k * g + g - 1 share key head k (transformers' repeat_kv): one matmul per key head.
    q = query.reshape(b, kv, g * lq, d)
    scores = torch.matmul(q, key.transpose(-1, -2)).mul_(scaling).view(b, kv, g, lq, lk)
    if attention_mask is None:
        if lq > 1 and getattr(module, "is_causal", True):  # in place: the matmul keeps no output for backward
            scores.add_(_causal_bias(lq, lk, scores.dtype, scores.device))
    elif attention_mask.dtype == torch.bool:
        scores.masked_fill_(~attention_mask[:, :, None, :, :lk], torch.finfo(scores.dtype).min)
    else:
        scores = scores + attention_mask[:, :, None, :, :lk]
    # In the scores' dtype: the CPU kernel accumulates bf16 in float32 and rounds once (as a float32 softmax cast
    # to bf16, three times faster), and autograd keeps this output, the tensor the value matmul keeps anyway.
    probs = torch.softmax(scores, dim=-1)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    out = torch.matmul(probs.view(b, kv, g * lq, lk), value)  # [B, KV, G * Lq, D]
    return out.view(b, h, lq, d).transpose(1, 2).contiguous()


@contextlib.contextmanager
def use_cpu_attention(model, active: bool = True):
    """Within the block, `model` (a transformers model, or a PEFT model around one) attends with
    `attention_forward`; its previous attention implementation is restored afterwards."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    previous = base.config._attn_implementation
    if not active or previous == NAME:
        yield
        return
    AttentionInterface.register(NAME, attention_forward)  # idempotent: the registries are dicts by name
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    base.set_attn_implementation(NAME)
    try:
        yield
    finally:
        base.set_attn_implementation(previous)
        _BIAS.clear()
