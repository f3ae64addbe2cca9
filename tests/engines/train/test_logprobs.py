"""Log-probs at each row's own sampling temperature (engines/train/logprobs.py, through the trainer), on the
tiny model: against log_softmax(logits / T) computed directly, and against TRL's own fused head at T = 1."""

from __future__ import annotations

import types

import pytest

from sage.configs.schema import TrainConfig
from sage.engines.train.rows import TrainRow, check_rows, read_rows, write_rows
from sage.engines.train.step import load_policy


def _cfg(**kw) -> TrainConfig:
    base = dict(lora_rank=4, lora_alpha=8, lr=1e-3, minibatch_size=4, grad_accum=1, loss_weighting="token_mean")
    base.update(kw)
    return TrainConfig(**base)


def _rows(temperatures: list[float], seed: int = 3) -> list[TrainRow]:
    import random

    rng = random.Random(seed)
    return [TrainRow(prompt_ids=[rng.randrange(3, 300) for _ in range(rng.randint(3, 9))],
                     completion_ids=[rng.randrange(3, 300) for _ in range(rng.randint(4, 11))],
                     advantage=rng.uniform(-1, 1), role=("solver", "critic")[i % 2], temperature=t)
            for i, t in enumerate(temperatures)]


def _direct_logprobs(model, row: TrainRow):
    """log_softmax(logits / T)[token] and the entropy of softmax(logits / T) at each completion token, from the
    model's full logits over the unpadded row."""
    import torch

    ids = torch.tensor([row.prompt_ids + row.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / row.temperature
    logp = torch.log_softmax(logits[:-1], dim=-1)[len(row.prompt_ids) - 1:]
    targets = torch.tensor(row.completion_ids)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, targets[:, None])[:, 0], entropy


@pytest.fixture(scope="module")
def trainer_and_batch(tiny_model):
    import torch

    from sage.engines.train.trainer import build_trainer

    rows = _rows([0.7, 1.3, 0.7, 1.3])
    model = load_policy(str(tiny_model), None, _cfg(), seed=0)
    with torch.no_grad():  # a non-zero adapter, so the LoRA path is part of what is compared
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    trainer, _ = build_trainer(model, str(tiny_model), rows, _cfg(), seed=0, device="cpu", torch_dtype=torch.float32)
    batch = trainer._generate_and_score_completions([{"row": i} for i in range(len(rows))])
    yield trainer, batch, rows, model
    import shutil

    shutil.rmtree(trainer.args.output_dir, ignore_errors=True)


def _scored(trainer, batch):
    import torch

    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, mask, batch["completion_ids"].size(1), compute_entropy=True,
            temperatures=batch["temperatures"])
    return logps, ent


def test_each_row_is_scored_at_its_own_temperature(trainer_and_batch):
    import torch

    trainer, batch, rows, model = trainer_and_batch
    assert batch["temperatures"].tolist() == pytest.approx([0.7, 1.3, 0.7, 1.3])
    logps, ent = _scored(trainer, batch)
    for i, row in enumerate(rows):
        c = len(row.completion_ids)
        want_lp, want_ent = _direct_logprobs(model, row)
        torch.testing.assert_close(logps[i, :c], want_lp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent[i, :c], want_ent, rtol=1e-5, atol=1e-5)
        assert torch.all(logps[i, c:] == 0) and torch.all(ent[i, c:] == 0)  # padding scores nothing
        at_one, _ = _direct_logprobs(model, TrainRow(row.prompt_ids, row.completion_ids, 0.0, temperature=1.0))
        assert (logps[i, :c] - at_one).abs().max() > 1e-3  # the temperature made a difference


def test_no_entropy_unless_asked(trainer_and_batch):
    import torch

    trainer, batch, _, _ = trainer_and_batch
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, ent, _ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, mask,
                                                                   batch["completion_ids"].size(1), batch_size=3,
                                                                   temperatures=batch["temperatures"])
    assert ent is None
    torch.testing.assert_close(logps, _scored(trainer, batch)[0], rtol=1e-6, atol=1e-6)  # chunks of 3 rows: same


def _loss_and_grads(trainer, batch):
    model = trainer.model
    model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, dict(batch))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def test_at_temperature_one_the_loss_and_gradients_are_trl_fused_heads(tiny_model):
    """All rows at T = 1: the same loss and LoRA gradients as TRL's own `_get_per_token_logps_and_entropies`
    (its fused head over the whole padded batch), which this trainer used before rows had temperatures."""
    import torch
    from trl import GRPOTrainer

    from sage.engines.train.trainer import build_trainer

    rows = _rows([1.0] * 6, seed=11)
    cfg = _cfg(minibatch_size=6)
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    trainer, _ = build_trainer(model, str(tiny_model), rows, cfg, seed=0, device="cpu", torch_dtype=torch.float32)
    try:
        batch = trainer._generate_and_score_completions([{"row": i} for i in range(len(rows))])
        trainer.current_gradient_accumulation_steps = 1  # set by `train()` for each update
        ours_loss, ours = _loss_and_grads(trainer, batch)
        trainer._get_per_token_logps_and_entropies = types.MethodType(
            GRPOTrainer._get_per_token_logps_and_entropies, trainer)
        trl_loss, theirs = _loss_and_grads(trainer, batch)
        del trainer._get_per_token_logps_and_entropies
    finally:
        import shutil

        shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
    assert ours and set(ours) == set(theirs) and all("lora_" in n for n in ours)
    assert abs(ours_loss) > 1e-4 and ours_loss == pytest.approx(trl_loss, rel=1e-5, abs=1e-7)
    for name, g in ours.items():
        torch.testing.assert_close(g, theirs[name], rtol=1e-4, atol=1e-6)


def test_stored_logprobs_are_the_behaviour_policy_at_any_temperature(tiny_model):
    """The backends store log-probs at the sampling temperature, which the trainer takes each row at: stored
    log-probs are the behaviour policy mu of the importance correction, row by row (a row without them weighs 1),
    compared with pi_old at the row's temperature, so log-probs stored by the same policy weigh 1 at any
    temperature. They are never pi_old (`old_per_token_logps`: absent when the pass makes one update)."""
    import torch

    from sage.engines.train.trainer import build_trainer

    cfg = _cfg(minibatch_size=2)
    for temperature, stored in ((1.0, 2), (0.7, 2), (0.7, 1)):
        rows = _rows([temperature, temperature])
        model = load_policy(str(tiny_model), None, cfg, seed=0)
        for r in rows[:stored]:
            r.logprobs = _direct_logprobs(model, r)[0].tolist()
        trainer, _ = build_trainer(model, str(tiny_model), rows, cfg, seed=0, device="cpu", torch_dtype=torch.float32)
        try:
            batch = trainer._generate_and_score_completions([{"row": 0}, {"row": 1}])
            inputs = dict(batch)
            current = torch.zeros_like(batch["sampling_per_token_logps"])
            for i, r in enumerate(rows):
                current[i, :len(r.completion_ids)] = _direct_logprobs(model, r)[0]
            trainer._weigh(inputs, current)
        finally:
            import shutil

            shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
        assert "old_per_token_logps" not in batch and batch["corrected"].tolist() == [1.0, float(stored == 2)]
        for i, r in enumerate(rows[:stored]):
            n = len(r.completion_ids)
            assert torch.allclose(batch["sampling_per_token_logps"][i, :n], torch.tensor(r.logprobs))
        mask = batch["completion_mask"].bool()
        assert torch.allclose(inputs["advantages"][mask], (batch["advantages"][:, None] * mask)[mask], atol=1e-5)


def test_rows_file_keeps_temperatures_and_reads_old_files_at_one(tmp_path):
    import pyarrow.parquet as pq

    rows = _rows([0.7, 1.3])
    write_rows(rows, tmp_path / "rows.parquet")
    assert [r.temperature for r in read_rows(tmp_path / "rows.parquet")] == [0.7, 1.3]
    old = pq.read_table(tmp_path / "rows.parquet").drop_columns(["temperature"])  # written before temperatures
    pq.write_table(old, tmp_path / "old.parquet")
    assert [r.temperature for r in read_rows(tmp_path / "old.parquet")] == [1.0, 1.0]
    rows[1].constrained = True  # sampled under a grammar: kept, so the isolated trainer does not correct it
    write_rows(rows, tmp_path / "rows.parquet")
    assert [r.constrained for r in read_rows(tmp_path / "rows.parquet")] == [False, True]
    pq.write_table(pq.read_table(tmp_path / "rows.parquet").drop_columns(["constrained"]), tmp_path / "old.parquet")
    assert [r.constrained for r in read_rows(tmp_path / "old.parquet")] == [False, False]  # written before it


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_temperature_that_is_not_positive_is_refused(bad):
    rows = _rows([1.0, bad])
    with pytest.raises(ValueError, match="row 1: temperature"):
        check_rows(rows)
