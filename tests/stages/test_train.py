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
    from sage.stages.score import REWARD_VERSION, score_id
    from sage.stages.train import stored_rows
    from sage.warehouse import Warehouse

    def rollout(rid, role, purpose):
        return {"rollout_id": rid, "run_id": "r", "iteration": 1, "stage": purpose, "role": role, "purpose": purpose,
                "question_id": "q", "template": "v1", "prompt_text": "p", "completion_text": "c",
                "prompt_ids": [1, 2], "completion_ids": [3], "sample_index": 0, "seed": 0, "format_reward": 1.0}

    def score(rid, role, advantage):
        return {"score_id": score_id(rid, REWARD_VERSION), "rollout_id": rid, "reward_version": REWARD_VERSION,
                "run_id": "r", "iteration": 1, "role": role, "reward": 0.5, "components": {}, "group_key": role,
                "advantage": advantage}

    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("rollouts", [rollout("a", "challenger", "challenge"), rollout("b", "solver", "solve"),
                                     rollout("c", "planner", "plan"), rollout("d", "solver", "solve")])
        wh.insert_batch("scores", [score("a", "challenger", 1.0), score("b", "solver", -1.0),
                                   score("c", "planner", 0.5), score("d", "solver", 1.0)])
        every = stored_rows(wh, load_config(overrides=["train.roles=[challenger, planner, critic, solver]"]), "r", 1)
        solver = stored_rows(wh, load_config(overrides=["train.roles=[solver]"]), "r", 1)
        two = stored_rows(wh, load_config(overrides=["train.roles=[planner, solver]"]), "r", 1)
    assert sorted(r.role for r in every) == ["challenger", "planner", "solver", "solver"]
    assert [(r.role, r.advantage) for r in solver] == [("solver", -1.0), ("solver", 1.0)]
    assert sorted(r.role for r in two) == ["planner", "solver", "solver"]


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
