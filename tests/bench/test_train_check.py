"""bench/train_check.py's verdict on a `bench/train.py` result, and the sampling log-probs bench/train.py gives its
random rows (what the hf backend stores: log_softmax(logits / T) of each completion token under the policy)."""

from __future__ import annotations

import pytest

from bench.train import sampling_logprobs
from bench.train_check import verdict
from sage.engines.train.rows import TrainRow


def _result(ratio: float, plain: list[float], trl: list[float]) -> dict:
    return {"ratio": ratio, "grad_norms": {"plain": plain, "trl": trl}}


def test_the_check_passes_a_lead_with_the_same_updates_and_fails_each_shortfall():
    assert verdict(_result(1.45, [1.18, 1.85], [1.22, 1.89]), 1.3, 0.05) == []
    slow = verdict(_result(1.02, [1.18, 1.85], [1.22, 1.89]), 1.3, 0.05)
    assert len(slow) == 1 and "1.02x" in slow[0] and "1.30x" in slow[0]
    drift = verdict(_result(1.45, [1.18, 1.85], [1.22, 2.00]), 1.3, 0.05)
    assert len(drift) == 1 and drift[0].startswith("update 2's gradient norm")
    assert len(verdict(_result(1.45, [1.18, 1.85], [1.22]), 1.3, 0.05)) == 1  # a missing update


def test_random_rows_get_the_policys_sampling_logprobs_at_their_temperature(tiny_model):
    import torch

    from sage.configs.schema import TrainConfig
    from sage.engines.train.step import load_policy

    model = load_policy(str(tiny_model), None, TrainConfig(lora_rank=4, lora_alpha=8), seed=0)
    rows = [TrainRow(prompt_ids=[5, 9, 14], completion_ids=[7, 3, 21, 8], advantage=1.0, temperature=0.7),
            TrainRow(prompt_ids=[11, 4], completion_ids=[30, 2], advantage=-1.0)]
    out = sampling_logprobs(model, rows)
    for row, scored in zip(rows, out):
        assert row.logprobs is None and scored.completion_ids == row.completion_ids
        ids = torch.tensor([row.prompt_ids + row.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(row.prompt_ids) - 1:-1].float() / row.temperature
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(row.completion_ids)[:, None])[:, 0]
        assert scored.logprobs == pytest.approx(expected.tolist(), abs=1e-5)
