"""bench/train_check.py's verdict on `bench/train.py`'s results, the sampling log-probs bench/train.py gives its
random rows (what the hf backend stores: log_softmax(logits / T) of each completion token under the policy), and
its plain loop taking the trainer's gradients (the float32 comparison the check makes)."""

from __future__ import annotations

import pytest

from bench.train import make_rows, plain_peft_step, sampling_logprobs, trl_row_order
from bench.train_check import norm_gaps, verdict
from sage.engines.train.rows import TrainRow


def _result(ratio: float, plain: list[float], trl: list[float]) -> dict:
    return {"ratio": ratio, "grad_norms": {"plain": plain, "trl": trl}}


def test_the_check_gates_bf16_throughput_and_float32_norms_and_fails_each_shortfall():
    fp32 = _result(1.0, [1.224442, 1.816615], [1.224442, 1.816613])
    # bf16 norms a few percent apart are rounding: only the float32 run's norms are checked
    assert verdict(_result(1.52, [1.18, 1.85], [1.24, 1.94]), fp32, 1.3, 0.001) == []
    slow = verdict(_result(1.02, [1.18, 1.85], [1.22, 1.89]), fp32, 1.3, 0.001)
    assert len(slow) == 1 and "1.02x" in slow[0] and "1.30x" in slow[0]
    # pi_old the current policy instead of the one that drew the rows: 1.3% off in the second update
    drift = verdict(_result(1.52, [1.18, 1.85], [1.22, 1.89]), _result(1.0, [1.224442, 1.816615],
                                                                        [1.224442, 1.841003]), 1.3, 0.001)
    assert len(drift) == 1 and drift[0].startswith("update 2's float32 gradient norm") and "1.34%" in drift[0]
    missing = verdict(_result(1.52, [1.18, 1.85], [1.22, 1.89]), _result(1.0, [1.22, 1.82], [1.22]), 1.3, 0.001)
    assert len(missing) == 1 and "1 updates" in missing[0]
    assert norm_gaps(_result(1.0, [2.0, 1.0], [1.9, 1.0])) == pytest.approx([0.05, 0.0])


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


def test_the_plain_loop_takes_the_trainers_gradients_with_stored_pi_old(tiny_model):
    """Two updates in float32 on rows that carry the first policy's log-probs: the second update weighs its rows
    against that policy (TRL's clipped ratio), so both loops take the same gradient norms (with the current policy
    as pi_old, as the plain loop took before, the second is 1.7% off)."""
    import dataclasses

    from sage.configs.schema import TrainConfig
    from sage.engines.train.step import load_policy, train_model

    cfg = TrainConfig(lora_rank=4, lora_alpha=8, lr=3e-2, minibatch_size=2, grad_accum=2,
                      loss_weighting="token_mean", old_policy="sampler")
    rows = [dataclasses.replace(r, temperature=0.7 if i % 2 else 1.0)  # each row's own temperature
            for i, r in enumerate(make_rows(8, 12, 10, 200, jitter=0.5, prompt_jitter=0.5))]
    rows = sampling_logprobs(load_policy(str(tiny_model), None, cfg, seed=0), rows)
    ours = train_model(load_policy(str(tiny_model), None, cfg, seed=0), str(tiny_model), rows, cfg, seed=0)
    plain = plain_peft_step(load_policy(str(tiny_model), None, cfg, seed=0), trl_row_order(rows), cfg)
    assert plain["grad_norms"] == pytest.approx([s["grad_norm"] for s in ours["steps"]], rel=1e-4)
