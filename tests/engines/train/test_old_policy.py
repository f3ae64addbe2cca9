"""pi_old and the importance correction (docs/decisions.md, "The old policy and the importance correction"), on
the tiny model, on CPU: pi_old is the trainer's own log-probs of the generating policy; the stored sampling
log-probs only weigh tokens, capped, and only for rows sampled without a grammar."""

from __future__ import annotations

import math
import shutil

import pytest

from sage.configs.schema import TrainConfig
from sage.engines.train.rows import TrainRow
from sage.engines.train.step import load_policy, train_model


def _cfg(**kw) -> TrainConfig:
    base = dict(lora_rank=4, lora_alpha=8, lr=2e-2, minibatch_size=2, grad_accum=2, loss_weighting="token_mean")
    base.update(kw)
    return TrainConfig(**base)


def _rows(n: int = 4, seed: int = 11) -> list[TrainRow]:
    import random

    rng = random.Random(seed)
    return [TrainRow(prompt_ids=[rng.randrange(3, 300) for _ in range(rng.randint(3, 7))],
                     completion_ids=[rng.randrange(3, 300) for _ in range(rng.randint(4, 8))],
                     advantage=(1.0, -1.0)[i % 2] * rng.uniform(0.5, 1.0), role="solver") for i in range(n)]


def _logprobs(model, row: TrainRow):
    """The completion tokens' log-probs under `model` (temperature 1), by a plain forward pass."""
    import torch

    ids = torch.tensor([row.prompt_ids + row.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)[len(row.prompt_ids) - 1:]
    return logp.gather(-1, torch.tensor(row.completion_ids)[:, None])[:, 0]


def _with(rows: list[TrainRow], shift=None, constrained: bool = False, model=None) -> list[TrainRow]:
    """Copies of `rows` whose stored log-probs are the initial policy's plus `shift(i, token_logprobs)` (None: no
    stored log-probs), sampled under a grammar when `constrained`."""
    out = []
    for i, r in enumerate(rows):
        lp = None if shift is None else (_logprobs(model, r) + shift(i, _logprobs(model, r))).tolist()
        out.append(TrainRow(list(r.prompt_ids), list(r.completion_ids), r.advantage, lp, r.role, r.temperature,
                            constrained))
    return out


def _train(tiny_model, rows, cfg, spy=None):
    """Train a fresh (seeded, identical) adapter once over `rows`; its LoRA weights and the metrics."""
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    metrics = train_model(model, str(tiny_model), rows, cfg, seed=0, device="cpu")
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}, metrics


def _same(a: dict, b: dict) -> bool:
    import torch

    return all(torch.allclose(a[n], b[n], rtol=0, atol=1e-7) for n in a)


@pytest.fixture(scope="module")
def initial(tiny_model):
    return load_policy(str(tiny_model), None, _cfg(), seed=0).eval()


def test_one_update_takes_pi_old_from_its_own_pass_whatever_was_stored(tiny_model, initial):
    """(1) One update (4 rows, 2 x 2 micro-batches): pi_old is the detached log-probs of the loss's own pass, so
    stored log-probs far from the policy (1 nat above on the positive rows, below on the negative) change
    nothing when they weigh nothing (correction off, or rows sampled under a grammar): the same update as
    without stored log-probs, ratio 1, nothing clipped. (Before: they were pi_old, and half the tokens clipped.)"""
    rows = _rows()
    off = lambda i, lp: 1.0 if i % 2 == 0 else -1.0  # noqa: E731
    reference, m0 = _train(tiny_model, _with(rows), _cfg())
    assert m0["n_updates"] == 1 and m0["clip_fraction"] == 0.0
    for variant, cfg in ((_with(rows, off, model=initial), _cfg(importance_correction=False)),
                         (_with(rows, off, constrained=True, model=initial), _cfg())):
        weights, m = _train(tiny_model, variant, cfg)
        assert m["clip_fraction"] == 0.0 and _same(weights, reference)
        assert m["loss"] == pytest.approx(m0["loss"], abs=1e-7)
        assert m["corrected_rows"] == 0 and m["importance_ratio_mean"] is None and m["old_logps_seconds"] == 0.0


def test_several_updates_score_pi_old_once_before_the_first(tiny_model, initial, monkeypatch):
    """(2) Two updates (4 rows, 2 x 1): the second update's pi_old is the policy before the first update (scored
    once, before it), not the policy the first update left, which the loss's own pass uses. Only the second
    update's rows are scored: the first update's pass is itself the policy before any update."""
    import torch

    from sage.engines.train.trainer import StoredRowsTrainer as cls

    seen, scored = [], []
    original, original_old = cls._compute_loss, cls._old_logps

    def spy(self, model, inputs):
        seen.append((self.state.global_step, inputs["completion_ids"].clone(), inputs["completion_mask"].clone(),
                     inputs.get("old_per_token_logps")))
        return original(self, model, inputs)

    def spy_old(self):
        out = original_old(self)
        scored.extend(tuple(self.sage_rows[i].completion_ids) for i in out)
        return out

    monkeypatch.setattr(cls, "_compute_loss", spy)
    monkeypatch.setattr(cls, "_old_logps", spy_old)
    rows = _rows()
    cfg = _cfg(grad_accum=1)
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    m = train_model(model, str(tiny_model), rows, cfg, seed=0, device="cpu")
    assert m["n_updates"] == 2
    by_tokens = {tuple(r.completion_ids): r for r in rows}
    after = model.eval()
    later = [s for s in seen if s[0] == 1]
    assert later and all((s[3] is None) == (s[0] == 0) for s in seen)  # the first update: its own pass
    assert sorted(scored) == sorted(tuple(ids[b, :int(mask[b].sum())].tolist()) for _, ids, mask, _ in later
                                    for b in range(ids.size(0)) if mask[b].any())
    for _, ids, mask, old in later:
        for b in range(ids.size(0)):
            n = int(mask[b].sum())
            if n == 0:
                continue
            row = by_tokens[tuple(ids[b, :n].tolist())]
            assert torch.allclose(old[b, :n], _logprobs(initial, row), atol=1e-5)
            assert not torch.allclose(old[b, :n], _logprobs(after, row), atol=1e-3)  # the update moved it
    assert m["old_logps_seconds"] > 0


def test_the_importance_weight_is_the_capped_ratio_to_the_stored_logprobs(tiny_model, initial):
    """(3) Each corrected token's advantage is multiplied by min(exp(pi_old - mu), cap), mu the stored log-prob;
    the update's metrics report the weights' mean, minimum and capped fraction; a lower cap changes the update."""
    import torch

    from sage.engines.train.trainer import build_trainer, importance_weights

    w, capped = importance_weights(torch.tensor([[0.0, -1.0, -2.0, 0.0]]), torch.tensor([[-2.0, -1.5, -1.0, 5.0]]),
                                   torch.tensor([[1, 1, 1, 0]]), cap=3.0)
    assert torch.allclose(w, torch.tensor([[3.0, math.exp(0.5), math.exp(-1.0), 1.0]]))
    assert capped.tolist() == [[True, False, False, False]]

    deltas = [-2.0, 0.5, -0.3, 1.5]  # mu = pi_old - delta, so the ratio is exp(delta): e^-2, e^0.5, e^-0.3, e^1.5
    shift = lambda i, lp: torch.tensor([-deltas[k % 4] for k in range(len(lp))])  # noqa: E731
    rows = _with(_rows(), shift, model=initial)
    cfg = _cfg()
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    trainer, _ = build_trainer(model, str(tiny_model), rows, cfg, seed=0, device="cpu", torch_dtype=torch.float32)
    try:
        batch = trainer._generate_and_score_completions([{"row": i} for i in range(len(rows))])
        inputs = dict(batch)
        current = torch.zeros_like(batch["sampling_per_token_logps"])
        for i, r in enumerate(rows):
            current[i, :len(r.completion_ids)] = _logprobs(initial, r)
        trainer._weigh(inputs, current)
        for i, r in enumerate(rows):
            n = len(r.completion_ids)
            expected = torch.tensor([min(math.exp(deltas[k % 4]), 3.0) for k in range(n)])
            assert torch.allclose(inputs["advantages"][i, :n], r.advantage * expected, atol=1e-5)
    finally:
        shutil.rmtree(trainer.args.output_dir, ignore_errors=True)

    tokens = [k % 4 for r in rows for k in range(len(r.completion_ids))]
    weights3, m = _train(tiny_model, rows, cfg)
    assert m["corrected_rows"] == 4
    assert m["importance_ratio_mean"] == pytest.approx(sum(min(math.exp(deltas[k]), 3.0) for k in tokens)
                                                       / len(tokens), abs=1e-5)
    assert m["importance_ratio_min"] == pytest.approx(math.exp(-2.0), abs=1e-5)
    assert m["importance_capped_fraction"] == pytest.approx(sum(k == 3 for k in tokens) / len(tokens))
    assert m["steps"][0]["importance/ratio_min"] == pytest.approx(math.exp(-2.0), abs=1e-5)
    weights_uncapped, m = _train(tiny_model, rows, _cfg(importance_cap=10.0))
    assert m["importance_capped_fraction"] == 0.0 and not _same(weights3, weights_uncapped)


def test_under_a_grammar_masked_and_unmasked_stored_logprobs_train_alike(tiny_model, initial):
    """(4) The same rows sampled under a grammar, stored as vLLM does (the masked, renormalised distribution:
    higher log-probs) or as the hf backend does (the unmasked one), train alike: weight 1, ratio pi / pi_old.
    Sampled without a grammar, a stored log-prob above pi_old is a mismatch the correction weighs down."""
    rows = _rows()
    masked = lambda i, lp: -lp * 0.8  # noqa: E731  (log-prob 0.8 of the way to 0: most mass was masked out)
    unmasked = lambda i, lp: 0.0 * lp  # noqa: E731
    hf, m_hf = _train(tiny_model, _with(rows, unmasked, constrained=True, model=initial), _cfg())
    vllm, m_vllm = _train(tiny_model, _with(rows, masked, constrained=True, model=initial), _cfg())
    none, _ = _train(tiny_model, _with(rows), _cfg())
    assert _same(hf, vllm) and _same(hf, none)
    assert m_hf["corrected_rows"] == m_vllm["corrected_rows"] == 0 and m_vllm["importance_ratio_mean"] is None
    free, m_free = _train(tiny_model, _with(rows, masked, constrained=False, model=initial), _cfg())
    assert m_free["corrected_rows"] == 4 and m_free["importance_ratio_mean"] < 1.0 and not _same(free, none)


def test_sampler_old_policy_takes_the_stored_logprobs_and_skips_the_recompute(tiny_model, initial, monkeypatch):
    """(5) `train.old_policy` sampler (auto on the hf backend): with several updates, every micro-batch's pi_old is
    the stored log-probs, nothing is scored before the first update and nothing is importance-weighted; a row
    without stored log-probs makes the pass recompute as `recompute` does. `stages.train.train_config` resolves
    auto by backend."""
    import torch

    from sage.configs import load_config
    from sage.engines.train.trainer import StoredRowsTrainer as cls
    from sage.stages.train import train_config

    seen = []
    original = cls._compute_loss

    def spy(self, model, inputs):
        seen.append((inputs["completion_ids"].clone(), inputs["completion_mask"].clone(),
                     inputs.get("old_per_token_logps"), "sampling_per_token_logps" in inputs))
        return original(self, model, inputs)

    monkeypatch.setattr(cls, "_compute_loss", spy)
    shift = lambda i, lp: torch.full_like(lp, -0.25 * (i + 1))  # noqa: E731  (stored: off the policy, known)
    rows = _with(_rows(), shift, model=initial)
    stored = {tuple(r.completion_ids): torch.tensor(r.logprobs) for r in rows}
    _, m = _train(tiny_model, rows, _cfg(grad_accum=1, old_policy="sampler"))
    assert m["n_updates"] == 2 and m["old_policy"] == "sampler" and m["old_logps_seconds"] == 0.0
    assert m["corrected_rows"] == 0 and m["importance_ratio_mean"] is None
    assert seen and not any(s[3] for s in seen)
    for ids, mask, old, _ in seen:
        for b in range(ids.size(0)):
            n = int(mask[b].sum())
            if n:
                assert torch.equal(old[b, :n], stored[tuple(ids[b, :n].tolist())])
    # One row stored no log-probs: the whole pass recomputes pi_old (the second update's micro-batches get the
    # initial policy's; the first's take their own pass's, the same policy), and the importance correction weighs
    # the other rows' tokens by exp(pi_old - mu), the initial policy against the stored log-probs, in both
    # updates (in the second, not the policy the first left).
    partial = _with(_rows(), shift, model=initial)
    partial[0] = _with(_rows()[:1])[0]
    by_tokens = {tuple(r.completion_ids): (i, r) for i, r in enumerate(partial)}
    seen.clear()
    weighed = []
    original_weigh = cls._weigh

    def spy_weigh(self, inputs, current):
        before = inputs["advantages"].clone()
        original_weigh(self, inputs, current)
        weighed.append((self.state.global_step, inputs["completion_ids"].clone(), inputs["completion_mask"].clone(),
                        before, inputs["advantages"].clone()))

    monkeypatch.setattr(cls, "_weigh", spy_weigh)
    _, m = _train(tiny_model, partial, _cfg(grad_accum=1, old_policy="sampler"))
    assert m["old_policy"] == "recompute" and m["old_logps_seconds"] > 0 and m["corrected_rows"] == 3
    assert any(old is None for _, _, old, _ in seen) and any(old is not None for _, _, old, _ in seen)
    for ids, mask, old, _ in seen:
        for b in range(ids.size(0) if old is not None else 0):
            n = int(mask[b].sum())
            if n:
                assert torch.allclose(old[b, :n], _logprobs(initial, by_tokens[tuple(ids[b, :n].tolist())][1]),
                                      atol=1e-5)
    assert {step for step, *_ in weighed} == {0, 1}
    for _, ids, mask, before, after in weighed:
        for b in range(ids.size(0)):
            n = int(mask[b].sum())
            if n:
                i, _row = by_tokens[tuple(ids[b, :n].tolist())]
                expected = 1.0 if i == 0 else math.exp(0.25 * (i + 1))
                assert torch.allclose(after[b, :n], before[b] * expected, atol=1e-4)

    assert train_config(load_config("cpu")).old_policy == "sampler"
    assert train_config(load_config("cpu", ["model.backend=vllm", "train.isolate=true"])).old_policy == "recompute"
    assert train_config(load_config("cpu", ["train.old_policy=recompute"])).old_policy == "recompute"
