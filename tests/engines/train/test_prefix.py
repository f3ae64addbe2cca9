"""Shared prompt prefixes (`train.share_prefix`): which prefixes an update shares, and a step that computes them once
against the same step running every row whole."""

from __future__ import annotations

import random

import pytest

from sage.configs.schema import TrainConfig
from sage.engines.train.prefix import update_prefixes
from sage.engines.train.rows import TrainRow
from sage.engines.train.step import load_policy, train_model


def test_update_prefixes_groups_prompts_and_cuts_before_each_prompts_end():
    a, b = list(range(10, 40)), list(range(100, 130))
    prompts = [
        a + [1, 2], a + [3], a[:25] + [9, 9],  # share 25 tokens
        b[:20], b[:20],  # identical prompts: cut to 19, each keeps one token
        [7] * 30,  # alone: nothing to share
        [5] * 10 + [1], [5] * 10 + [2],  # share 10 < MIN_SHARED
    ]
    assert update_prefixes(prompts) == [tuple(a[:25]), tuple(b[:19])]
    assert update_prefixes(prompts, min_shared=5) == [tuple(a[:25]), tuple(b[:19]), (5,) * 10]
    # groups of their own: prompts that share less than MIN_SHARED with a group start another
    assert update_prefixes([a, a[:20] + [1], a[:28] + [2], a[:20] + [3]]) == [tuple(a[:20])]
    assert update_prefixes([b + a, a, b + [1], a[:28] + [2]]) == [tuple(b), tuple(a[:28])]


def _rows(seed: int = 0) -> list[TrainRow]:
    """Solver rows: a 40-token prefix of their role, then one of three questions (several samples each); critic
    rows: a 24-token prefix; one planner row of its own. Random completions and advantages."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(3, 300) for _ in range(n)]  # noqa: E731
    solver, critic = tok(40), tok(24)
    questions = [tok(rng.randint(3, 9)) for _ in range(3)]
    rows = [TrainRow(prompt_ids=solver + questions[i % 3], completion_ids=tok(rng.randint(2, 9)),
                     advantage=rng.uniform(-1, 1), role="solver") for i in range(9)]
    rows += [TrainRow(prompt_ids=critic + tok(rng.randint(1, 6)), completion_ids=tok(rng.randint(2, 6)),
                      advantage=rng.uniform(-1, 1), role="critic") for _ in range(4)]
    rows.append(TrainRow(prompt_ids=tok(30), completion_ids=tok(5), advantage=0.7, role="planner"))
    rng.shuffle(rows)
    return rows


def _step(tiny_model, rows, cfg, dtype):
    model = load_policy(str(tiny_model), None, cfg, seed=0, dtype=dtype)
    init = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    metrics = train_model(model, str(tiny_model), rows, cfg, seed=0, device="cpu")
    return metrics, {n: p.detach() - init[n] for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("minibatch, accum", [(1, 7), (3, 2)])
def test_shared_prefixes_give_the_step_of_whole_rows_in_float32(tiny_model, minibatch, accum):
    """The same rows and seed with and without shared prefixes: the same per-update losses, gradient norms and
    adapter within float32 rounding, and prefix tokens were saved (one row a pass, and passes of several rows
    mixing roles and rows without a prefix)."""
    import torch

    rows = _rows()
    cfg = dict(lora_rank=4, lora_alpha=8, lr=1e-2, minibatch_size=minibatch, grad_accum=accum)
    shared, shared_delta = _step(tiny_model, rows, TrainConfig(**cfg, share_prefix=True), torch.float32)
    whole, whole_delta = _step(tiny_model, rows, TrainConfig(**cfg, share_prefix=False), torch.float32)

    assert whole["prefix_tokens_saved"] == 0 and shared["prefix_tokens_saved"] >= 40
    assert shared["n_updates"] == whole["n_updates"] == -(-len(rows) // (minibatch * accum))
    for a, b in zip(shared["steps"], whole["steps"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["grad_norm"] > 0
    assert any(float(d.abs().max()) > 0 for d in whole_delta.values())
    # Adam divides each gradient by its running scale, so an element whose gradient is near zero turns float32
    # rounding into a visible step: the bound is a thousandth of one step (lr), not of the element.
    for name, d in shared_delta.items():
        torch.testing.assert_close(d, whole_delta[name], rtol=1e-3, atol=1e-3 * cfg["lr"])


def test_shared_prefixes_in_bf16_within_bf16_tolerance(tiny_model):
    """bf16 base, float32 LoRA (as `cpu.yaml` trains): the same updates within bf16 rounding."""
    import torch

    rows = _rows(seed=3)
    cfg = dict(lora_rank=4, lora_alpha=8, lr=1e-3, minibatch_size=1, grad_accum=7)
    shared, shared_delta = _step(tiny_model, rows, TrainConfig(**cfg, share_prefix=True), torch.bfloat16)
    whole, whole_delta = _step(tiny_model, rows, TrainConfig(**cfg, share_prefix=False), torch.bfloat16)
    assert shared["prefix_tokens_saved"] > 0
    for a, b in zip(shared["steps"], whole["steps"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=3e-2, abs=2e-3)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=3e-2)
    flat = lambda d: torch.cat([d[n].flatten().float() for n in sorted(d)])  # noqa: E731
    cos = torch.nn.functional.cosine_similarity(flat(shared_delta), flat(whole_delta), dim=0)
    assert float(flat(whole_delta).norm()) > 0 and float(cos) > 0.98


def test_an_update_holds_one_prefix_graph_at_a_time(tiny_model, monkeypatch):
    """One row a pass: the update's rows run grouped by prefix and each prefix's graph is released at its last row,
    so no prefix is still held when the next is computed (before, every prefix of an update lived to its end)."""
    import torch

    from sage.engines.train import prefix

    alive, computed = [], []
    cache = prefix.SharedPrefixes.cache

    def watched(self, model, p, batch, device):
        if p not in self._computed:
            alive.append(len(self._computed))
            computed.append((self, p))  # one SharedPrefixes per update (kept alive, so never confused)
        return cache(self, model, p, batch, device)

    monkeypatch.setattr(prefix.SharedPrefixes, "cache", watched)
    cfg = TrainConfig(lora_rank=4, lora_alpha=8, lr=1e-2, minibatch_size=1, grad_accum=7, share_prefix=True)
    metrics, _ = _step(tiny_model, _rows(), cfg, torch.float32)
    assert metrics["prefix_tokens_saved"] > 0
    assert len(computed) >= 3  # the two updates share several prefixes between them
    assert alive == [0] * len(computed)
    assert len(set(computed)) == len(computed)  # no prefix released early and computed again in its update
