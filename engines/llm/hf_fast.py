"""The `hf` backend's decoder-layer step for Llama-style models (llama, qwen2, qwen3, mistral).

Why a second implementation of the layer: at batch 64 on a CPU a decode step of the model's own modules is
mostly small matmuls whose oneDNN kernels run well below peak, plus many tiny ops. `FusedDecoder` keeps the
arithmetic of transformers' layer (same ops in the same order and dtype, so greedy outputs match `generate`,
except where a prefix the batch shares is prefilled once: `engines/llm/hf.py`) but runs fewer, larger matmuls:

- q/k/v are one matmul and gate/up another. The model's own parameters are re-pointed to row slices of the
  fused weight, so nothing is copied and every other user of the model (PEFT included) sees the same tensors.
  Each output column is the same dot product, and for up to `FUSE_MAX_ROWS` rows (a decode step) the fused
  matmul was bit-identical to the separate ones in fp32 and bf16, 1 and 2 threads. With more rows (prefill)
  oneDNN's bf16 kernel choice depends on the output width and the rounding differed, so those run the
  separate matmuls, as the modules do.
- On a CPU in bf16 the weights are also reordered once into oneDNN's blocked layout (the op inductor uses
  for frozen linears); plain `F.linear` reorders the weight on every call.
- LoRA stays unmerged: `x A^T B^T * scaling` of every adapted projection is added to the fused output.
  Merging into bf16 weights would round away most of a small adapter update, so the log-probs would no longer
  be the trained policy's. It computes in `adapter_compute_dtype` of the base, as the trainer does: under a
  float32 base in the adapter's float32, exactly as PEFT's modules; under a bf16 base in bf16 (the trainer's
  autocast, and vLLM's LoRA kernels), with the scaling folded into B and, in a decode step, A's rows appended
  to the packed weight so that `x A^T` comes out of the base matmul. Float32 LoRA matmuls there were thin,
  slow and many (two per projection group per layer per token: generation took 1.4x as long as without the
  adapter, docs/performance.md). In a prefill with a bf16 adapter the projection group is one matmul and
  `(x A^T) B^T` is accumulated into its output (`addmm_`, no separate add over the whole output), instead of
  the separate matmuls, two LoRA matmuls and an add (`python -m bench.adapter_generation`, docs/performance.md).
  The base output is then rounded as the fused matmul rounds it, and the LoRA product is added to it
  unrounded (one rounding where the modules take two): within a bf16 rounding of the modules under the
  trainer's autocast, not bit-identical to them (without an adapter a prefill stays bit-identical to
  `generate`). Adapters PEFT computes differently (DoRA and other variants, LoRA bias, merged or several
  active adapters) are not fused: `FusedDecoder.set_lora` returns False and the backend runs the modules
  themselves (`module_layer`).
- transformers' RMSNorm (six ops) becomes `weight * F.rms_norm(x)` where that gives the module's exact
  output; q and k get their rotary embedding in one op sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sage.engines.llm.models import adapter_compute_dtype

FUSE_MAX_ROWS = 128


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' `apply_rotary_pos_emb` for one tensor (cos/sin already broadcastable to `x`)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _attend(q, k, v, kc, vc, start: int, end: int, mask, scale: float) -> torch.Tensor:
    """q, k, v: (B, T, heads, hd); k/v are written to cache slots [start, end). Returns (B, T, heads * hd).
    The SDPA calls are transformers' own (`sdpa_attention_forward`), so the rounding is too: with a padding
    mask, a decode step packs the query heads of one KV group as that group's queries (`pack_gqa`) and a
    prefill repeats K/V; without one (mask None: no row is padded) both use SDPA's GQA, prefill as causal.
    A prefill after a shared prefix (start > 0) always has a mask and attends to the cache's [0, end)."""
    B, T, heads, hd = q.shape
    kv_heads = kc.shape[1]
    kc[:, :, start:end] = k.transpose(1, 2)
    vc[:, :, start:end] = v.transpose(1, 2)
    if mask is None:
        keys, values = (kc[:, :, :end], vc[:, :, :end]) if T == 1 else (k.transpose(1, 2), v.transpose(1, 2))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=T > 1, scale=scale,
                                           enable_gqa=True)
    elif T == 1:
        o = F.scaled_dot_product_attention(q.reshape(B, kv_heads, heads // kv_heads, hd), kc[:, :, :end],
                                           vc[:, :, :end], attn_mask=mask, scale=scale)
        return o.reshape(B, 1, heads * hd)
    else:  # a prefill; after a shared prefix (start > 0) its keys come from the cache
        rep = heads // kv_heads
        keys, values = (k.transpose(1, 2), v.transpose(1, 2)) if start == 0 else (kc[:, :, :end], vc[:, :, :end])
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys.repeat_interleave(rep, 1),
                                           values.repeat_interleave(rep, 1), attn_mask=mask, scale=scale)
    return o.transpose(1, 2).reshape(B, T, heads * hd)


def module_layer(layer, h, cos, sin, kc, vc, start: int, end: int, mask):
    """One decoder layer through the model's own modules, so any PEFT adapter applies, whatever its kind.
    h: (B, T, hidden); cos/sin: (B, T, 1, hd) in h's dtype; mask: additive, broadcastable to the scores, or
    None when no row is padded and a prefill starts at slot 0 (it is then causal)."""
    attn = layer.self_attn
    B, T, _ = h.shape
    hd = kc.shape[-1]
    x = layer.input_layernorm(h)
    q = attn.q_proj(x).view(B, T, -1, hd)
    k = attn.k_proj(x).view(B, T, -1, hd)
    v = attn.v_proj(x).view(B, T, -1, hd)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    o = _attend(_rope(q, cos, sin), _rope(k, cos, sin), v, kc, vc, start, end, mask, attn.scaling)
    h = h + attn.o_proj(o)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def _lora_parts(module: nn.Module):
    """(A, B, scaling) of a PEFT LoRA layer with one vanilla adapter active; None for a plain `nn.Linear` or an
    inactive adapter. Raises NotImplementedError for whatever PEFT would compute differently."""
    if isinstance(module, nn.Linear):
        return None
    if not hasattr(module, "lora_A") or not isinstance(getattr(module, "base_layer", None), nn.Linear):
        raise NotImplementedError(f"{type(module).__name__} is not a LoRA-wrapped nn.Linear")
    if module.disable_adapters:
        return None
    active = [a for a in module.active_adapters if a in module.lora_A]
    if not active:
        return None
    name = active[0]
    if module.merged or len(active) > 1 or name in getattr(module, "lora_variant", {}) \
            or module.lora_B[name].bias is not None:
        raise NotImplementedError("not one unmerged vanilla LoRA adapter")
    return module.lora_A[name].weight, module.lora_B[name].weight, module.scaling[name]


class FusedLinear:
    """`x W^T + b` for the row-concatenation W of some linear layers, plus their LoRA terms if adapted."""

    def __init__(self, modules: list[nn.Module], pack: bool):
        base = [getattr(m, "base_layer", m) for m in modules]
        self.sizes = [b.out_features for b in base]
        self.width = sum(self.sizes)
        with torch.no_grad():
            if len(base) == 1:
                self.weight = base[0].weight
            else:  # the model's parameters become views of the fused weight: no second copy
                self.weight = torch.cat([b.weight for b in base])
                for b, part in zip(base, self.weight.split(self.sizes)):
                    b.weight.data = part
            biases = [b.bias for b in base]
            self.bias = None if all(x is None for x in biases) else torch.cat(
                [x if x is not None else self.weight.new_zeros(n) for x, n in zip(biases, self.sizes)])
        self.pack = pack
        self.lora = None
        self.packed, self.packed_bias, self.packed_rank = self._packed(None)
        self.set_lora(modules)

    def set_lora(self, modules: list[nn.Module]) -> None:
        """Pick up the adapter of `modules` (the same layers, maybe now wrapped by PEFT); raises if unsupported.

        `self.lora`: None, or (A, B, scaling per output column) in float32, or under a bf16 base (A, scaling * B,
        None) in bf16, A's rows also appended to the packed weight."""
        parts = [_lora_parts(m) for m in modules]
        self.lora = None
        if any(p is not None for p in parts):
            ref = next(p for p in parts if p is not None)[0]
            ranks = [p[0].shape[0] if p is not None else 0 for p in parts]
            with torch.no_grad():
                a = torch.cat([p[0] if p is not None else ref.new_zeros(0, ref.shape[1]) for p in parts])
                b = ref.new_zeros(self.width, sum(ranks))  # block diagonal: member i reads only its own A rows
                scale = ref.new_zeros(self.width)
                row, col = 0, 0
                for p, n, r in zip(parts, self.sizes, ranks):
                    if p is not None:
                        b[row:row + n, col:col + r] = p[1]
                        scale[row:row + n] = p[2]
                    row, col = row + n, col + r
                dtype = adapter_compute_dtype(self.weight.dtype)
                self.lora = (a, b, scale) if dtype is None else (a.to(dtype), (b * scale[:, None]).to(dtype), None)
        appended = self.lora[0] if self.lora is not None and self.lora[2] is None else None
        if self.packed_rank or appended is not None:  # the packed weight changes only if A rows come or go
            self.packed, self.packed_bias, self.packed_rank = self._packed(appended)
        # B packed too, for the decode step's `(x A^T) B^T` (plain F.linear reorders its weight on every call)
        self.packed_b = torch.ops.mkldnn._reorder_linear_weight(self.lora[1], 64) if self.packed_rank else None

    def _packed(self, a: torch.Tensor | None):
        """The weight in oneDNN's blocked layout for decode steps, with the rows of the bf16 A `a` appended;
        its bias, and how many rows were appended. (None, None, 0) unless packing."""
        if not self.pack:
            return None, None, 0
        weight, bias = self.weight.detach(), self.bias
        if a is not None:
            weight = torch.cat([weight, a])
            bias = None if bias is None else torch.cat([bias, bias.new_zeros(a.shape[0])])
        return torch.ops.mkldnn._reorder_linear_weight(weight, 64), bias, 0 if a is None else a.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xa = None  # x A^T, when the packed matmul computed it
        big = x.numel() > FUSE_MAX_ROWS * x.shape[-1]
        if big and self.lora is not None and self.lora[2] is None:  # a prefill with a bf16 adapter
            a, b, _ = self.lora
            flat = x.reshape(-1, x.shape[-1])
            y = F.linear(flat, self.weight, self.bias).addmm_(F.linear(flat, a), b.t())
            return y.view(*x.shape[:-1], self.width)
        if big:
            biases = self.bias.split(self.sizes) if self.bias is not None else [None] * len(self.sizes)
            y = torch.cat([F.linear(x, w, b) for w, b in zip(self.weight.split(self.sizes), biases)], -1)
        elif self.packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.packed_bias, "none", [], "")
            if self.packed_rank:
                y, xa = y[..., :self.width], y[..., self.width:]
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.lora is None:
            return y
        a, b, scale = self.lora
        if scale is None:  # bf16, as under the trainer's autocast: y + (x A^T) (scaling B)^T
            if xa is not None:
                return y + torch.ops.mkldnn._linear_pointwise(xa, self.packed_b, None, "none", [], "")
            return y + F.linear(F.linear(x, a), b)
        # float32, as PEFT: result + lora_B(lora_A(x.to(A dtype))) * scaling, back to y's dtype
        return (y + F.linear(F.linear(x.to(a.dtype), a), b) * scale).to(y.dtype)


def fast_norm(module: nn.Module):
    """`weight * F.rms_norm(x)`, one kernel where transformers' RMSNorm runs six, if it gives the module's exact
    output on a probe (it did for Llama/Qwen's RMSNorm, fp32 and bf16); else the module itself."""
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return module
    shape = (weight.shape[0],)

    def norm(x: torch.Tensor) -> torch.Tensor:
        return weight * F.rms_norm(x, shape, None, eps)

    gen = torch.Generator(device="cpu").manual_seed(0)
    probe = torch.cat([torch.randn(8, shape[0], generator=gen) * 10.0 ** e for e in (-3, 0, 2)])
    probe = probe.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        return norm if torch.equal(norm(probe), module(probe)) else module


class FusedLayer:
    def __init__(self, layer, pack: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.layer = layer
        self.norm1, self.norm2 = fast_norm(layer.input_layernorm), fast_norm(layer.post_attention_layernorm)
        self.qkv = FusedLinear([attn.q_proj, attn.k_proj, attn.v_proj], pack)
        self.o = FusedLinear([attn.o_proj], pack)
        self.gate_up = FusedLinear([mlp.gate_proj, mlp.up_proj], pack)
        self.down = FusedLinear([mlp.down_proj], pack)
        self.scale = attn.scaling
        self.act = mlp.act_fn
        self.qk_norm = (fast_norm(attn.q_norm), fast_norm(attn.k_norm)) if hasattr(attn, "q_norm") else None  # qwen3

    def set_lora(self) -> None:
        attn, mlp = self.layer.self_attn, self.layer.mlp
        self.qkv.set_lora([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o.set_lora([attn.o_proj])
        self.gate_up.set_lora([mlp.gate_proj, mlp.up_proj])
        self.down.set_lora([mlp.down_proj])

    def __call__(self, h, cos, sin, kc, vc, start: int, end: int, mask):
        """Same result as `module_layer(self.layer, ...)`, same arguments."""
        B, T, _ = h.shape
        hd = kc.shape[-1]
        nq, nkv = self.qkv.sizes[0] // hd, self.qkv.sizes[1] // hd
        qkv = self.qkv(self.norm1(h)).view(B, T, nq + 2 * nkv, hd)
        if self.qk_norm is None:  # rope of q and k in one go: it is elementwise, per head
            qk = _rope(qkv[:, :, :nq + nkv], cos, sin)
            q, k = qk[:, :, :nq], qk[:, :, nq:]
        else:
            q = _rope(self.qk_norm[0](qkv[:, :, :nq]), cos, sin)
            k = _rope(self.qk_norm[1](qkv[:, :, nq:nq + nkv]), cos, sin)
        h = h + self.o(_attend(q, k, qkv[:, :, nq + nkv:], kc, vc, start, end, mask, self.scale))
        gu = self.gate_up(self.norm2(h))
        inter = self.gate_up.sizes[0]
        return h + self.down(self.act(gu[..., :inter]) * gu[..., inter:])


class FusedDecoder:
    """Fused layers and lm_head of a Llama-style causal LM; see the module docstring."""

    def __init__(self, model: nn.Module, pack: bool):
        self.model = model
        self.layers = [FusedLayer(layer, pack) for layer in model.get_decoder().layers]
        self.norm = fast_norm(model.get_decoder().norm)
        head = model.get_output_embeddings()
        self.head = FusedLinear([head], pack) if type(head) is nn.Linear and head.bias is None else None

    @classmethod
    def build(cls, model: nn.Module, dtype: torch.dtype, device: torch.device) -> FusedDecoder | None:
        """None when the model's linear layers are not plain (or vanilla-LoRA) `nn.Linear`s."""
        pack = device.type == "cpu" and dtype == torch.bfloat16 and _mkldnn_bf16()
        try:
            return cls(model, pack)
        except NotImplementedError:
            return None

    def set_lora(self) -> bool:
        """Pick up the adapter PEFT injected into (or removed from) the model; False if it cannot be fused."""
        try:
            for layer in self.layers:
                layer.set_lora()
            if self.head is not None:
                self.head.set_lora([self.model.get_output_embeddings()])
        except NotImplementedError:
            return False
        return True

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h) if self.head is not None else self.model.get_output_embeddings()(h)


def _mkldnn_bf16() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        return False
