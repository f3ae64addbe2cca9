"""SAGE.md step 11 on the tiny model: every role weighs the same in the loss, and AdamW's state (moments, step
count) and the scheduler's carry from one iteration's adapter to the next, so a re-run gives the same adapter."""

from __future__ import annotations

import dataclasses
import random
import shutil
from collections import defaultdict

import pytest

from sage.configs.schema import TrainConfig
from sage.engines.train.rows import TrainRow, pass_role_weights, role_shares, role_weights
from sage.engines.train.step import OPTIMIZER_FILE, load_optimizer_state, load_policy, train_model, train_step


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(lora_rank=4, lora_alpha=8, lr=1e-3, minibatch_size=2, grad_accum=1), **kw})


def _rows() -> list[TrainRow]:
    # unequal counts and lengths: two long solver answers, one short critic, one planner
    spec = [("solver", 10, 0.8), ("solver", 30, -0.4), ("critic", 5, 0.6), ("planner", 5, -1.0)]
    return [TrainRow(prompt_ids=[5 + i, 7, 9], completion_ids=[(11 * i + 3 * j) % 250 + 3 for j in range(n)],
                     advantage=a, role=role) for i, (role, n, a) in enumerate(spec)]


def test_role_weights_hand_computed():
    tokens = {"solver": 40, "critic": 5, "planner": 5}                 # N = 50 tokens, R = 3 roles
    w = role_weights(["solver", "solver", "critic", "planner", None], tokens)
    assert w == pytest.approx([50 / 120, 50 / 120, 50 / 15, 50 / 15, 0.0])   # 0.41667, 3.33333
    # with one unit of loss per token, each role contributes sum(w * tokens) / N = 1/3 of the loss
    shares = {"solver": (w[0] * 10 + w[1] * 30) / 50, "critic": w[2] * 5 / 50, "planner": w[3] * 5 / 50}
    assert shares == pytest.approx({"solver": 1 / 3, "critic": 1 / 3, "planner": 1 / 3})
    # (the token mean gives the solver 40/50 = 0.8 of the loss, the critic and the planner 0.1 each)
    assert role_weights(["a"], {"a": 7, "b": 0}) == [1.0]              # an absent role does not count


def test_role_shares_normalise_the_configured_weights_over_the_roles_present():
    assert role_shares({"solver": 90, "planner": 10}, None) == {"solver": 0.5, "planner": 0.5}
    assert role_shares({"solver": 90, "planner": 10}, {"solver": 3, "planner": 1}) == {"solver": 0.75,
                                                                                       "planner": 0.25}
    assert role_shares({"solver": 90, "planner": 0}, {"solver": 3, "planner": 1}) == {"solver": 1.0}


def test_pass_role_weights_hand_computed():
    # a pass of 2 updates; role totals T = {solver: 40, planner: 10}, shares 3/4 and 1/4; this update holds 25 tokens
    w = pass_role_weights(["solver", "planner", None], 25, {"solver": 40, "planner": 10},
                          {"solver": 0.75, "planner": 0.25}, updates=2)
    assert w == pytest.approx([2 * 25 * 0.75 / 40, 2 * 25 * 0.25 / 10, 0.0])


def _pass_shares(tiny_model, rows: list[TrainRow], cfg: TrainConfig, seed: int) -> dict[str, float]:
    """Each role's weight in the pass as the trainer builds its updates: sum over updates of the role's
    advantage-weighted completion tokens over the update's tokens (the `dapo` normaliser), over the updates; every
    row's advantage is 1, so this is the share of the loss the role's tokens carry."""
    import torch

    from sage.engines.train.trainer import build_trainer

    trainer, _ = build_trainer(load_policy(str(tiny_model), None, cfg, seed=seed), str(tiny_model), rows, cfg,
                               seed=seed, device="cpu", torch_dtype=torch.float32)
    order, n = list(trainer._get_train_sampler()), len(rows)
    block, repeats = trainer.args.generation_batch_size, trainer.args.steps_per_generation
    updates, weight = trainer.args.max_steps, defaultdict(float)
    for start in range(0, len(order), block * repeats):
        idx = order[start:start + block]
        batch = trainer._generate_and_score_completions([{"row": i if i < n else -1} for i in idx])
        tokens = float(batch["num_items_in_batch"])
        for i, advantage, mask in zip(idx, batch["advantages"].tolist(), batch["completion_mask"]):
            if i < n:
                weight[rows[i].role] += advantage * float(mask.sum()) / tokens / updates
    return dict(weight)


def _mixed_rows(seed: int) -> list[TrainRow]:
    """27 rows, most of them the Solver's, one Planner row in about nine, of random lengths, in a random order."""
    rng = random.Random(seed)
    rows = []
    for i in range(27):
        length = rng.randint(1, 30)
        completion = [(7 * i + j) % 200 + 3 for j in range(length)]
        role = "planner" if rng.random() < 0.12 or i == 0 else "solver"
        rows.append(TrainRow(prompt_ids=[5 + i % 7, 7, 9], completion_ids=completion, advantage=1.0, role=role,
                             logprobs=[-1.0] * length))
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_role_share_gives_each_role_its_configured_share_of_the_pass_whatever_the_order(tiny_model, seed):
    rows = _mixed_rows(seed)
    cfg = _cfg(minibatch_size=2, grad_accum=4, old_policy="sampler", roles=["solver", "planner"],
               role_shares={"solver": 3, "planner": 1})
    assert _pass_shares(tiny_model, rows, cfg, seed) == pytest.approx({"solver": 0.75, "planner": 0.25})
    equal = cfg.model_copy(update={"role_shares": None})
    assert _pass_shares(tiny_model, rows, equal, seed) == pytest.approx({"solver": 0.5, "planner": 0.5})
    # per update (`role_mean`, before `role_share`), the roles' shares of the pass follow how the rows fell
    per_update = _pass_shares(tiny_model, rows, equal.model_copy(update={"loss_weighting": "role_mean"}), seed)
    assert per_update["solver"] > 0.55


def test_role_shares_name_every_trained_role_with_a_positive_weight():
    with pytest.raises(ValueError, match="no share for trained role"):
        TrainConfig(roles=["solver", "planner"], role_shares={"solver": 1})
    with pytest.raises(ValueError, match="untrained role"):
        TrainConfig(roles=["solver"], role_shares={"solver": 1, "planner": 1})
    with pytest.raises(ValueError, match="positive"):
        TrainConfig(roles=["solver", "planner"], role_shares={"solver": 1, "planner": 0})
    with pytest.raises(ValueError, match="role_share"):
        TrainConfig(roles=["solver"], role_shares={"solver": 1}, loss_weighting="role_mean")


def _lora(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("weighting", ["role_mean", "role_share"])   # the same with one update a pass
def test_role_mean_is_token_mean_on_reweighted_advantages(tiny_model, weighting):
    rows = _rows()
    cfg = _cfg(minibatch_size=4, loss_weighting=weighting)             # one update over the whole block
    a = load_policy(str(tiny_model), None, cfg, seed=0)
    train_model(a, str(tiny_model), rows, cfg, seed=0, device="cpu")
    w = role_weights([r.role for r in rows], {"solver": 40, "critic": 5, "planner": 5})
    scaled = [dataclasses.replace(r, advantage=r.advantage * wi) for r, wi in zip(rows, w)]
    b = load_policy(str(tiny_model), None, cfg, seed=0)
    train_model(b, str(tiny_model), scaled, cfg.model_copy(update={"loss_weighting": "token_mean"}), seed=0,
                device="cpu")
    c = load_policy(str(tiny_model), None, cfg, seed=0)
    train_model(c, str(tiny_model), rows, cfg.model_copy(update={"loss_weighting": "token_mean"}), seed=0,
                device="cpu")
    la, lb, lc = _lora(a), _lora(b), _lora(c)
    assert all(bool((la[n] == lb[n]).all()) for n in la)              # bit for bit
    assert any(not bool((la[n] == lc[n]).all()) for n in la)          # and not the plain token mean


def test_role_mean_needs_dapo():
    with pytest.raises(ValueError, match="loss_type dapo"):
        TrainConfig(loss_type="grpo")
    with pytest.raises(ValueError, match="loss_type dapo"):
        TrainConfig(loss_type="grpo", loss_weighting="role_mean")
    assert TrainConfig(loss_type="grpo", loss_weighting="token_mean").loss_type == "grpo"


def _files(d) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "sage_train_metrics.json"}


def test_optimizer_state_carries_over_and_a_rerun_is_bit_exact(tiny_model, tmp_path):
    rows, cfg = _rows(), _cfg()                                       # 4 rows, minibatch 2: 2 updates a step
    a1 = tmp_path / "iteration-1"
    m1 = train_step(str(tiny_model), None, str(a1), rows, cfg, seed=1, device="cpu")
    s1 = load_optimizer_state(a1)
    assert m1["optimizer_steps"] == 2 and s1["scheduler"]["last_epoch"] == 2
    a2 = tmp_path / "iteration-2"
    m2 = train_step(str(tiny_model), str(a1), str(a2), rows, cfg, seed=2, device="cpu")
    s2 = load_optimizer_state(a2)
    assert m2["optimizer_steps"] == 4 and s2["scheduler"]["last_epoch"] == 4   # the step count continues
    assert load_optimizer_state(a1)["optimizer"]["state"][0]["step"] == 2      # the input is never modified
    # a re-run of iteration 2 (what resume does after a kill during training: no checkpoint row, the adapter
    # and optimizer state of iteration 1 untouched) gives the same adapter and optimizer state, bit for bit
    again = tmp_path / "iteration-2-again"
    train_step(str(tiny_model), str(a1), str(again), rows, cfg, seed=2, device="cpu")
    assert _files(again) == _files(a2) and OPTIMIZER_FILE in _files(a2)
    # a fresh AdamW from the same adapter (what every iteration did before) trains a different adapter
    fresh_in = tmp_path / "iteration-1-no-optimizer"
    shutil.copytree(a1, fresh_in)
    (fresh_in / OPTIMIZER_FILE).unlink()
    fresh = tmp_path / "iteration-2-fresh"
    m3 = train_step(str(tiny_model), str(fresh_in), str(fresh), rows, cfg, seed=2, device="cpu")
    assert m3["optimizer_steps"] == 2
    assert _files(fresh)["adapter_model.safetensors"] != _files(a2)["adapter_model.safetensors"]
