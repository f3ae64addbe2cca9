"""The train stage's choice of each rollout's training temperature."""

from __future__ import annotations

from sage.configs import load_config
from sage.stages.train import sampling_temperature


def test_each_role_trains_at_its_own_sampling_temperature_and_greedy_at_one():
    cfg = load_config(overrides=["roles.critic.temperature=0.7", "roles.solver.temperature=1.3",
                                 "roles.planner.temperature=0"])
    assert sampling_temperature(cfg, "critic") == 0.7
    assert sampling_temperature(cfg, "solver") == 1.3
    assert sampling_temperature(cfg, "planner") == 1.0  # greedy: no tempered distribution, trained at 1
    assert sampling_temperature(cfg, "challenger") == cfg.roles.challenger.temperature


def test_train_roles_leaves_the_other_roles_rollouts_out_of_the_update(tmp_path):
    from sage.stages.train import stored_rows
    from sage.warehouse import Warehouse

    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("rollouts", [_rollout("a", "challenger", "challenge"), _rollout("b", "solver", "solve"),
                                     _rollout("c", "planner", "plan"), _rollout("d", "solver", "solve")])
        wh.insert_batch("scores", [_score("a", "challenger", 1.0), _score("b", "solver", -1.0),
                                   _score("c", "planner", 0.5), _score("d", "solver", 1.0)])
        every = stored_rows(wh, load_config(overrides=["train.roles=[challenger, planner, critic, solver]"]), "r", 1)
        solver = stored_rows(wh, load_config(overrides=["train.roles=[solver]"]), "r", 1)
        two = stored_rows(wh, load_config(overrides=["train.roles=[planner, solver]"]), "r", 1)
    assert sorted(r.role for r in every) == ["challenger", "planner", "solver", "solver"]
    assert [(r.role, r.advantage) for r in solver] == [("solver", -1.0), ("solver", 1.0)]
    assert sorted(r.role for r in two) == ["planner", "solver", "solver"]


def _rollout(rid: str, role: str, purpose: str, prompt_ids=(1, 2), completion_ids=(3,)) -> dict:
    return {"rollout_id": rid, "run_id": "r", "iteration": 1, "stage": purpose, "role": role, "purpose": purpose,
            "question_id": "q", "template": "v1", "prompt_text": "p", "completion_text": "c",
            "prompt_ids": list(prompt_ids), "completion_ids": list(completion_ids), "sample_index": 0, "seed": 0,
            "format_reward": 1.0}


def _score(rid: str, role: str, advantage: float) -> dict:
    from sage.stages.score import REWARD_VERSION, score_id

    return {"score_id": score_id(rid, REWARD_VERSION), "rollout_id": rid, "reward_version": REWARD_VERSION,
            "run_id": "r", "iteration": 1, "role": role, "reward": 0.5, "components": {}, "group_key": role,
            "advantage": advantage}


def test_train_roles_refuses_an_unknown_a_repeated_or_no_role():
    import pytest

    from sage.configs import ConfigError

    for value, says in [("[solvr]", "'challenger', 'planner', 'critic' or 'solver'"), ("[solver, solver]", "twice"),
                        ("[]", "at least 1")]:
        with pytest.raises(ConfigError, match=says):
            load_config(overrides=[f"train.roles={value}"])


def test_train_without_scored_rollouts_is_never_done(tmp_path):
    """Nothing scored: train raises before any model loads or adapter is written, it does not record one."""
    import pytest

    from sage.configs import load_config
    from sage.stages import train
    from sage.stages.context import StageContext
    from sage.warehouse import Warehouse

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        ctx = StageContext(load_config("cpu", [f"run.dir={tmp_path}"]), wh, run_id="r", iteration=2)
        with pytest.raises(RuntimeError, match=r"iteration 2 of run 'r' has no scored rollouts .*`sage stage score "
                                               r"--run r --iteration 2` first"):
            train.run(ctx)
        assert wh.count("checkpoints") == 0 and not (tmp_path / "adapters").exists()


def test_a_listed_role_without_rollouts_leaves_the_update_to_the_others(tiny_model, tmp_path):
    """cpu.yaml trains the Solver and the Planner; without the Planner (`iteration.planner` false) only the Solver has
    rollouts, and the train stage trains and records the adapter on them (`role_mean` over the roles present)."""
    from sage.stages import train
    from sage.stages.context import StageContext
    from sage.warehouse import Warehouse

    cfg = load_config("cpu", [f"run.dir={tmp_path}", f"model.name={tiny_model}", "iteration.planner=false",
                              "train.lora_rank=4", "train.lora_alpha=8", "train.mmap_threshold_kb=null"])
    assert [str(r) for r in cfg.train.roles] == ["solver", "planner"]
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        wh.insert_batch("rollouts", [_rollout(rid, "solver", "solve", (5, 6, 7), (8, 9, 10)) for rid in "ab"])
        wh.insert_batch("scores", [_score("a", "solver", 1.0), _score("b", "solver", -1.0)])
        report = train.run(StageContext(cfg, wh, run_id="r", iteration=1))
        metrics = wh.records("SELECT metrics FROM checkpoints WHERE run_id = 'r' AND iteration = 1")[0]["metrics"]
    assert (report.rows_in, report.rows_out) == (2, 1) and metrics["n_rows"] == 2
    assert set(metrics["adv_mean_by_role"]) == {"solver"}
    assert (tmp_path / "adapters" / "r" / "iteration-1" / "adapter_config.json").exists()


def test_train_roles_listing_only_roles_switched_off_is_refused():
    """Roles the ablation switches leave without rollouts cannot be the only ones trained: the update would have
    none. The Critic writes nothing only when both the Challenger and the Planner are off."""
    import pytest

    from sage.configs import ConfigError

    with pytest.raises(ConfigError, match=r"train.roles \(planner\) lists only roles that write nothing with "
                                          r"iteration.challenger=true and iteration.planner=false.*add solver"):
        load_config(overrides=["iteration.planner=false", "train.roles=[planner]"])
    with pytest.raises(ConfigError, match="lists only roles that write nothing"):
        load_config(overrides=["iteration.challenger=false", "iteration.planner=false",
                               "train.roles=[challenger, critic]"])
    assert load_config(overrides=["iteration.challenger=false", "train.roles=[challenger, critic]"])  # Critic: plans
    assert load_config(overrides=["iteration.planner=false", "train.roles=[planner]", "train.enabled=false"])
