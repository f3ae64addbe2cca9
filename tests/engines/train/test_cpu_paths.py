"""The training step's CPU paths: the token-chunked LM head, the training attention, the bf16 adapter compute,
each against the computation it replaces, and a whole bf16 step against the step without them."""

from __future__ import annotations

import contextlib
import random

import pytest

from sage.configs.schema import TrainConfig
from sage.engines.train.rows import TrainRow
from sage.engines.train.step import load_policy, train_model


def test_token_chunked_logprobs_are_log_softmax_with_its_gradients(monkeypatch):
    """Values, entropies and gradients (hidden, weight, bias) of plain `log_softmax`, across several chunks."""
    import torch

    from sage.engines.train import logprobs

    monkeypatch.setattr(logprobs, "_CHUNK_ELEMENTS", 3 * 50)  # 3 tokens a chunk of a 50-word vocabulary
    torch.manual_seed(0)
    hidden = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(50, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (10,))
    upstream = torch.randn(10, dtype=torch.float64)

    lp, ent = logprobs.token_chunked_logprobs(hidden, weight, bias, targets, 0.7, entropy=True)
    (lp * upstream).sum().backward()
    ours = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    logp = torch.log_softmax((hidden @ weight.T + bias).float() / 0.7, dim=-1)
    want = logp.gather(-1, targets[:, None])[:, 0]
    (want * upstream).sum().backward()
    torch.testing.assert_close(lp, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1).detach(), rtol=1e-5, atol=1e-5)
    assert not ent.requires_grad  # logged, never differentiated
    for got, t in zip(ours, (hidden, weight, bias)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-5)


def _qkv(batch: int, heads: int, kv_heads: int, length: int, dim: int = 16, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, n, length, dim, generator=g, requires_grad=True) for n in (heads, kv_heads, kv_heads)]


class _Causal:
    is_causal = True
    training = True


@pytest.mark.parametrize("padded", [False, True])
def test_cpu_attention_is_sdpa_with_its_gradients(padded):
    """Grouped-query attention, causal (no mask) or with a left-padded keep-mask as transformers builds it for
    `sdpa`: the output and the query, key and value gradients of `scaled_dot_product_attention`."""
    import torch
    import torch.nn.functional as F

    from sage.engines.train.attention import attention_forward

    q, k, v = _qkv(2, 6, 2, 9)
    mask = None
    if padded:
        keep = torch.ones(2, 9, dtype=torch.bool)
        keep[1, :3] = False  # the second row is left-padded by 3
        mask = keep[:, None, None, :] & torch.ones(9, 9, dtype=torch.bool).tril()[None, None]
        mask[1, :, :3, 0] = True  # no query row without a key (sdpa would give NaN there)
    upstream = torch.randn(2, 9, 6, 16)
    out, _ = attention_forward(_Causal(), q, k, v, mask, scaling=0.25)
    (out * upstream).sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=0.25,
                                          enable_gqa=True).transpose(1, 2)
    (want * upstream).sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for got, t in zip(ours, (q, k, v)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-5)


def test_packed_rows_attend_each_to_its_own_tokens():
    """One sequence of three packed rows (`cu_seq_lens_q`): each row's output and gradients are those of causal
    `sdpa` over that row alone; a mask passed beside it is not read."""
    import torch
    import torch.nn.functional as F

    from sage.engines.train.attention import attention_forward

    lengths = [4, 9, 2]
    q, k, v = _qkv(1, 6, 2, sum(lengths))
    cu = torch.tensor([0, 4, 13, 15], dtype=torch.int32)
    upstream = torch.randn(1, sum(lengths), 6, 16)
    out, _ = attention_forward(_Causal(), q, k, v, torch.zeros(1, 1, 15, 15, dtype=torch.bool), scaling=0.25,
                               cu_seq_lens_q=cu)
    (out * upstream).sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = torch.cat([F.scaled_dot_product_attention(q[:, :, a:e], k[:, :, a:e], v[:, :, a:e], is_causal=True,
                                                     scale=0.25, enable_gqa=True).transpose(1, 2)
                      for a, e in [(0, 4), (4, 13), (13, 15)]], dim=1)
    (want * upstream).sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for got, t in zip(ours, (q, k, v)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="rows' total"):
        attention_forward(_Causal(), q, k, v, None, scaling=0.25, cu_seq_lens_q=torch.tensor([0, 4, 13]))


def test_a_packed_batch_scores_every_row_as_alone(tiny_model):
    """`completion_logprobs` of a padded batch under the CPU attention packs the rows into one sequence: each
    row's log-probs, and the adapter's gradients of their sum, are those of scoring every row alone (float32)."""
    import torch

    from sage.engines.train.attention import packs, use_cpu_attention
    from sage.engines.train.logprobs import add_completion_head, completion_logprobs

    model = load_policy(str(tiny_model), None, TrainConfig(lora_rank=4, lora_alpha=8), seed=0)
    add_completion_head(model.get_base_model())
    for p in model.parameters():  # LoRA's B starts at zero: move it so its gradients depend on everything
        if p.requires_grad:
            p.data.normal_(0, 0.05)
    rows = _rows(4)
    p_len, c_len = max(len(r.prompt_ids) for r in rows), max(len(r.completion_ids) for r in rows)
    ids = torch.zeros(len(rows), p_len + c_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):  # TRL's layout: left-padded prompts, right-padded completions
        ids[i, p_len - len(r.prompt_ids):p_len] = torch.tensor(r.prompt_ids)
        ids[i, p_len:p_len + len(r.completion_ids)] = torch.tensor(r.completion_ids)
        mask[i, p_len - len(r.prompt_ids):p_len + len(r.completion_ids)] = 1
    temps = torch.tensor([r.temperature for r in rows])
    trained = [p for p in model.parameters() if p.requires_grad]

    def scored(chunks):
        model.zero_grad()
        lps = [completion_logprobs(model, ids[c], mask[c], c_len, temps[c])[0] for c in chunks]
        lp = torch.cat(lps)
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in trained]

    model.train()
    with use_cpu_attention(model):
        assert packs(model)
        packed, packed_grads = scored([slice(0, 4)])
        alone, alone_grads = scored([slice(i, i + 1) for i in range(4)])
    assert not packs(model)  # sdpa takes a padded batch
    assert (packed != 0).sum() == sum(len(r.completion_ids) for r in rows)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    for a, b in zip(packed_grads, alone_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_use_cpu_attention_sets_and_restores_the_models_attention(tiny_model):
    import torch

    from sage.engines.train.attention import NAME, use_cpu_attention

    model = load_policy(str(tiny_model), None, TrainConfig(lora_rank=4, lora_alpha=8), seed=0)
    ids = torch.tensor([[5, 9, 17, 33, 2, 71, 8], [0, 0, 12, 40, 7, 19, 3]])
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        with use_cpu_attention(model):
            assert model.get_base_model().config._attn_implementation == NAME
            got = model(input_ids=ids, attention_mask=mask).logits
    assert model.get_base_model().config._attn_implementation == "sdpa"
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-5)


def _rows(n: int, seed: int = 5) -> list[TrainRow]:
    rng = random.Random(seed)
    return [TrainRow(prompt_ids=[rng.randrange(3, 300) for _ in range(rng.randrange(6, 30))],
                     completion_ids=[rng.randrange(3, 300) for _ in range(rng.randrange(3, 20))],
                     advantage=rng.uniform(-1.5, 1.5), role=("solver", "critic", "planner")[i % 3],
                     temperature=(1.0, 0.7)[i % 2]) for i in range(n)]


def _bf16_step(tiny_model, rows, cfg) -> tuple[dict, dict]:
    import torch

    model = load_policy(str(tiny_model), None, cfg, seed=0, dtype=torch.bfloat16)
    init = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    metrics = train_model(model, str(tiny_model), rows, cfg, seed=0, device="cpu")
    delta = {n: p.detach() - init[n] for n, p in model.named_parameters() if p.requires_grad}
    return metrics, delta


@pytest.mark.parametrize("minibatch,grad_accum", [(1, 4), (2, 2), (4, 1)])
def test_a_bf16_step_is_the_step_without_the_cpu_paths_within_bf16_tolerance(tiny_model, monkeypatch, minibatch,
                                                                            grad_accum):
    """The same rows and seed through today's step (bf16 base and float32 LoRA) with and without the CPU paths
    (adapter in bf16 under autocast, this module's attention, with two or four rows a pass packed into one sequence
    (two: dealt by length, as `cpu.yaml` trains), the token-chunked head): the same per-update losses and gradient
    norms within bf16 tolerance, and the adapter moved the same way."""
    import torch

    from sage.engines.train import logprobs, step, trainer

    cfg = TrainConfig(lora_rank=4, lora_alpha=8, lr=1e-3, minibatch_size=minibatch, grad_accum=grad_accum)
    rows = _rows(12)
    fast, fast_delta = _bf16_step(tiny_model, rows, cfg)
    assert trainer.adapter_compute_dtype(torch.bfloat16) == torch.bfloat16
    monkeypatch.setattr(trainer, "adapter_compute_dtype", lambda dtype: None)
    monkeypatch.setattr(step, "use_cpu_attention", lambda model, active=True: contextlib.nullcontext())
    monkeypatch.setattr(logprobs, "use_trl_kernel", lambda device, softcap: True)
    ref, ref_delta = _bf16_step(tiny_model, rows, cfg)

    assert fast["n_updates"] == ref["n_updates"] == 3 and fast["dtype"] == "bfloat16"
    for a, b in zip(fast["steps"], ref["steps"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=3e-2, abs=2e-3)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=3e-2)
        assert a["grad_norm"] > 0
    def flat(d):
        return torch.cat([d[n].flatten().float() for n in sorted(d)])

    assert set(fast_delta) == set(ref_delta)
    cos = torch.nn.functional.cosine_similarity(flat(fast_delta), flat(ref_delta), dim=0)
    assert float(flat(fast_delta).norm()) > 0 and float(cos) > 0.98
