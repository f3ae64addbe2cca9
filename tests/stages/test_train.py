"""The train stage: which rows train, at which temperature, on which adapter; retention of old adapters."""

from __future__ import annotations

from pathlib import Path

from sage.configs import load_config
from sage.configs.names import Role
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


def test_a_rollout_is_trained_as_constrained_when_sampled_under_its_roles_grammar(tmp_path):
    """`rollouts.constrained` says whether a rollout was sampled under a grammar (the trainer then does not
    importance-correct it, engines/train/trainer.py); a rollout stored before that column (NULL) follows its
    role's `constrain`."""
    from sage.stages.train import sampled_constrained, stored_rows
    from sage.warehouse import Warehouse

    cfg = load_config(overrides=["roles.solver.constrain=true", "roles.planner.constrain=false"])
    assert sampled_constrained(cfg, {"role": "solver", "constrained": False}) is False  # annealing's free sample
    assert sampled_constrained(cfg, {"role": "planner", "constrained": True}) is True
    assert sampled_constrained(cfg, {"role": "solver", "constrained": None}) is True
    assert sampled_constrained(cfg, {"role": "planner"}) is False
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("rollouts", [_rollout("b", "solver", "solve"), _rollout("c", "planner", "plan")])
        wh.insert_batch("scores", [_score("b", "solver", -1.0), _score("c", "planner", 0.5)])
        rows = stored_rows(wh, load_config(overrides=["roles.solver.constrain=true", "roles.planner.constrain=false",
                                                      "train.roles=[planner, solver]"]), "r", 1)
    assert {r.role: r.constrained for r in rows} == {"solver": True, "planner": False}


def test_hinted_prompt_plain_trains_a_shown_answer_on_its_questions_plain_prompt(tmp_path):
    """`train.hinted_prompt` plain: a Solver answer sampled with its plan trains on the prompt its question's
    unhinted answers had, keeping its completion and its sampling log-probs (pi_old under the plan); `shown` and
    every other row keep their own prompt. A shown answer whose question has no plain answer is refused."""
    import pytest

    from sage.stages.train import stored_rows
    from sage.warehouse import Warehouse

    mixed = ["iteration.hints=mixed", "train.roles=[planner, solver]"]
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("rollouts", [
            _rollout("hinted", "solver", "solve", prompt_ids=(1, 2, 8, 8), question="q1", plan_shown=True),
            _rollout("plain", "solver", "solve", prompt_ids=(1, 2), question="q1", plan_shown=False),
            _rollout("other", "solver", "solve", prompt_ids=(4, 5), question="q2", plan_shown=False),
            _rollout("plan", "planner", "plan", prompt_ids=(6, 7), question="q1")])
        wh.insert_batch("scores", [_score(r, "planner" if r == "plan" else "solver", 0.5)
                                   for r in ("hinted", "plain", "other", "plan")])
        plain = stored_rows(wh, load_config(overrides=[*mixed, "train.hinted_prompt=plain"]), "r", 1)
        shown = stored_rows(wh, load_config(overrides=[*mixed, "train.hinted_prompt=shown"]), "r", 1)
        assert [(r.role, r.prompt_ids, r.logprobs) for r in plain] == [
            ("solver", [1, 2], [-0.5]), ("solver", [4, 5], [-0.5]), ("solver", [1, 2], [-0.5]),
            ("planner", [6, 7], [-0.5])]                          # ordered by rollout id: hinted, other, plain, plan
        assert [r.prompt_ids for r in shown] == [[1, 2, 8, 8], [4, 5], [1, 2], [6, 7]]
        wh.execute("DELETE FROM rollouts WHERE rollout_id = 'plain'")
        with pytest.raises(RuntimeError, match="question q1 has no answer without one"):
            stored_rows(wh, load_config(overrides=[*mixed, "train.hinted_prompt=plain"]), "r", 1)


def test_hinted_prompt_plain_needs_mixed_hints_and_the_samplers_logprobs():
    import pytest

    from sage.configs import ConfigError

    with pytest.raises(ConfigError, match="iteration.hints always does not write"):
        load_config(overrides=["train.hinted_prompt=plain", "iteration.hints=always"])
    with pytest.raises(ConfigError, match="use train.hinted_prompt=shown"):
        load_config(overrides=["train.hinted_prompt=plain", "iteration.hints=mixed", "train.old_policy=recompute"])
    assert load_config("cpu", ["train.hinted_prompt=plain", "iteration.hints=mixed"]).train.hinted_prompt == "plain"


def _rollout(rid: str, role: str, purpose: str, prompt_ids=(1, 2), completion_ids=(3,), question: str = "q",
             plan_shown: bool | None = None) -> dict:
    return {"rollout_id": rid, "run_id": "r", "iteration": 1, "stage": purpose, "role": role, "purpose": purpose,
            "question_id": question, "template": "v1", "prompt_text": "p", "completion_text": "c",
            "prompt_ids": list(prompt_ids), "completion_ids": list(completion_ids), "sample_index": 0, "seed": 0,
            "format_reward": 1.0, "logprobs": [-0.5] * len(completion_ids), "plan_shown": plan_shown}


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


def _trained(wh, project, run_id: str, iterations) -> None:
    """Checkpoint rows and adapter directories (weights, config, optimizer state) as the train stage leaves them,
    with a Planner's own adapter in `roles/planner` as `train.adapters` per_role writes it."""
    from sage.engines.train import OPTIMIZER_FILE

    for k in iterations:
        folder = project / "adapters" / run_id / f"iteration-{k}"
        for at in (folder, folder / "roles" / "planner"):
            at.mkdir(parents=True)
            for name in ("adapter_config.json", "adapter_model.safetensors", OPTIMIZER_FILE):
                (at / name).write_text(name)
        wh.insert_batch("checkpoints", [dict(run_id=run_id, iteration=k, adapter_path=str(folder))])


def test_retention_keeps_the_best_and_the_last_adapters_and_the_newest_optimizer_states(tmp_path):
    """train.keep_last=2 after iteration 3, then 5, with iteration 2 the best by validation: the adapters of the best
    and the last two stay, the optimizer state beside the last two; each deletion is recorded in `checkpoints`; a
    second call, or one for an earlier iteration (a resumed run passing it again), deletes nothing more; paths
    outside the project and keep_last null delete nothing."""
    import pytest

    from sage.engines.train import OPTIMIZER_FILE
    from sage.stages.context import StageContext
    from sage.stages.train import retain
    from sage.warehouse import Warehouse
    from sage.warehouse.validate_queries import mark_best

    project, other = tmp_path / "project", tmp_path / "other"
    cfg = load_config("cpu", ["train.keep_last=2"])
    with Warehouse.open(project / "warehouse.duckdb") as wh:
        _trained(wh, project, "r", range(1, 6))
        _trained(wh, other, "old", range(1, 6))  # absolute paths, as an older version stored them: not this project's
        wh.execute("UPDATE checkpoints SET adapter_path = 'adapters/r/iteration-' || iteration WHERE run_id = 'r'")
        wh.execute("UPDATE checkpoints SET val_accuracy = CASE WHEN iteration = 2 THEN 0.5 ELSE 0.25 END")
        assert mark_best(wh, "r") == 2

        def retained(k: int, c=cfg, run_id="r") -> dict:
            return retain(StageContext(c, wh, run_id=run_id, iteration=k))

        assert retained(3) == {"adapters": [1], "optimizers": []}
        assert retained(5) == {"adapters": [3], "optimizers": [2]}
        for again in (retained(5), retained(4), retained(5, load_config("cpu", ["train.keep_last=null"])),
                      retained(5, run_id="old")):
            assert again == {"adapters": [], "optimizers": []}
        pruned = {r["iteration"]: (r["a"], r["o"]) for r in wh.rows(
            "SELECT iteration, adapter_pruned_at IS NOT NULL AS a, optimizer_pruned_at IS NOT NULL AS o "
            "FROM checkpoints WHERE run_id = 'r'")}
    assert pruned == {1: (True, True), 2: (False, True), 3: (True, True), 4: (False, False), 5: (False, False)}
    adapters = project / "adapters" / "r"
    assert sorted(p.name for p in adapters.iterdir()) == ["iteration-2", "iteration-4", "iteration-5"]
    assert [(adapters / f"iteration-{k}" / OPTIMIZER_FILE).exists() for k in (2, 4, 5)] == [False, True, True]
    assert [(adapters / f"iteration-{k}" / "roles" / "planner" / OPTIMIZER_FILE).exists()
            for k in (2, 4, 5)] == [False, True, True]
    assert (adapters / "iteration-2" / "adapter_model.safetensors").exists()
    assert len(list(other.glob("adapters/old/iteration-*/**/" + OPTIMIZER_FILE))) == 10
    with pytest.raises(ValueError):
        load_config("cpu", ["train.keep_last=0"])  # the newest adapter is what the next iteration starts from


def test_a_stage_that_reads_what_retention_deleted_is_refused_before_anything_is_written(tmp_path):
    """After retention deleted iteration 1's adapter and iteration 2's optimizer state (the rows as `retain` leaves
    them): a redo of a stage of iteration 2 or 3 (their train stage starts from iteration 1's or 2's adapter and
    optimizer state), validation of iteration 1 and a checkpoint name for it are refused with a sentence that says
    what was deleted and by which setting; nothing is removed or recorded; what is kept still runs."""
    import pytest

    from sage.flows.record import run_recorded
    from sage.stages.context import StageContext
    from sage.warehouse import Warehouse
    from sage.warehouse.checkpoints import CheckpointPruned, check_retained, record_pruned, resolve_checkpoint
    from sage.warehouse.queries import mark_stage_finished, mark_stage_running, start_iteration
    from sage.warehouse.runs import check_stage_target, create_run

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        _trained(wh, tmp_path, "r", range(1, 5))
        wh.insert_batch("rollouts", [dict(_rollout("a", "solver", "solve"), iteration=2)])  # what a redo removes
        record_pruned(wh, "r", adapters=[1], optimizers=[2])
        for iteration, stage, says in [
                (2, "solve", r"stage solve of run 'r' iteration 2 cannot run: the iteration's train stage, which a "
                             r"redo of any of its stages runs again, starts from iteration 1's adapter and optimizer "
                             r"state, and checkpoint retention deleted iteration 1's adapter \(with its optimizer "
                             r"state\) on .*train.keep_last = K keeps the adapters of the best checkpoint.*Nothing was "
                             r"written.*--set train.keep_last=null"),
                (3, "train", "iteration 2's optimizer state on"),
                (1, "validate", "it answers with iteration 1's adapter")]:
            with pytest.raises(CheckpointPruned, match=says):
                check_retained(wh, "r", iteration, stage)
        for iteration, stage in [(4, "challenge"), (5, "train"), (2, "validate"), (1, "solve"), (0, "validate")]:
            check_retained(wh, "r", iteration, stage)

        cfg = load_config("cpu", [f"run.dir={tmp_path}"])
        with pytest.raises(CheckpointPruned, match="iteration 1's adapter"):
            run_recorded(StageContext(cfg, wh, run_id="r", iteration=2), "solve", lambda ctx: pytest.fail("ran"),
                         run_id="r", iteration=2, force=True)
        assert wh.count("stage_runs") == 0 and wh.count("rollouts") == 1
        # `sage stage` refuses it before a flow starts, unless the stage is done and not forced (then it runs nothing)
        create_run(wh, cfg, "r")
        start_iteration(wh, "r", 2, None)
        for done in (False, True):
            with pytest.raises(CheckpointPruned, match="iteration 1's adapter"):
                check_stage_target(wh, "r", 2, "challenge", force=done)
            mark_stage_running(wh, "r", 2, "challenge")
            mark_stage_finished(wh, "r", 2, "challenge", "done", 1, 1, 0.1, None)
        check_stage_target(wh, "r", 2, "challenge")
        with pytest.raises(CheckpointPruned, match=r"checkpoint iteration 1 of run 'r': checkpoint retention deleted "
                                                   r"its adapter on .*adapters on disk: iterations \[2, 3, 4\]"):
            resolve_checkpoint(wh, "r", "1")
        assert resolve_checkpoint(wh, "r", "2").adapter == str(tmp_path / "adapters" / "r" / "iteration-2")


def test_trackers_go_on_from_the_global_step_training_curve_gives(tmp_path):
    """The train stage's tracker step offset is the run's updates before the iteration, so iteration k's first
    update is at `training_curve.global_step` (TensorBoard draws one curve per run)."""
    from sage.warehouse import Warehouse
    from sage.warehouse.queries import record_train_step, train_steps_before

    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        for iteration, steps in ((1, 3), (2, 2), (3, 1)):
            for step in range(1, steps + 1):
                record_train_step(wh, "r", iteration, {"step": step, "loss": 0.1})
        record_train_step(wh, "other", 1, {"step": 1, "loss": 0.1})
        curve = {(r["iteration"], r["step"]): r["global_step"] for r in wh.rows(
            "SELECT iteration, step, global_step FROM training_curve WHERE run_id = 'r'")}
        assert [train_steps_before(wh, "r", k) for k in (1, 2, 3)] == [0, 3, 5]
        assert all(train_steps_before(wh, "r", k) + 1 == curve[(k, 1)] for k in (1, 2, 3))


def test_per_role_adapters_keep_the_planners_updates_off_the_solvers_adapter(tiny_model, tmp_path):
    """`train.adapters` per_role: the Solver's adapter (the checkpoint) is exactly the one its own rows alone train,
    where the shared adapter moves with the Planner's rows too; the Planner's own adapter goes in `roles/planner`.
    Each pass's updates are in `train_steps` with their role, numbered on from the Solver's. At iteration 2 the
    Planner, with no rows, keeps its adapter, and the Critic, never trained, generates with the base model."""
    from safetensors.torch import load_file

    from sage.stages import train
    from sage.stages.context import StageContext
    from sage.warehouse import Warehouse

    def trained(name: str, *overrides: str, iteration: int = 1, adapter: str | None = None,
                roles: tuple[str, ...] = ("solver", "planner")) -> tuple[Path, dict, list[dict], StageContext]:
        project = tmp_path / name
        cfg = load_config("cpu", [f"run.dir={project}", f"model.name={tiny_model}", "train.lora_rank=4",
                                  "train.lora_alpha=8", "train.mmap_threshold_kb=null", "train.minibatch_size=2",
                                  "train.grad_accum=1", *overrides])
        with Warehouse.open(project / "warehouse.duckdb") as wh:
            rows = [_rollout(f"s{k}-{iteration}", "solver", "solve", (5, 6, k + 7), (8, 9, k + 10))
                    for k in range(3)]
            rows += [_rollout(f"p{k}-{iteration}", "planner", "plan", (11, k + 12), (13, 14, 15, k + 16))
                     for k in range(2)]
            rows = [dict(r, iteration=iteration) for r in rows if r["role"] in roles]
            wh.insert_batch("rollouts", rows)
            wh.insert_batch("scores", [dict(_score(r["rollout_id"], r["role"], 1.0 - 0.7 * k), iteration=iteration)
                                       for k, r in enumerate(rows)])
            ctx = StageContext(cfg, wh, run_id="r", iteration=iteration, adapter=adapter)
            train.run(ctx)
            metrics = wh.records("SELECT metrics FROM checkpoints WHERE iteration = ?", [iteration])[0]["metrics"]
            steps = wh.rows("SELECT step, role FROM train_steps WHERE iteration = ? ORDER BY step", [iteration])
        return project / "adapters" / "r" / f"iteration-{iteration}", metrics, steps, ctx

    def weights(folder: Path) -> dict:
        return load_file(folder / "adapter_model.safetensors")

    def same(a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)

    alone, _, _, _ = trained("alone", "train.roles=[solver]")
    shared, _, shared_steps, _ = trained("shared")
    own, metrics, steps, _ = trained("own", "train.adapters=per_role")
    assert same(weights(own), weights(alone)) and not same(weights(shared), weights(alone))
    assert (own / "roles" / "planner" / "adapter_model.safetensors").is_file()
    assert not same(weights(own / "roles" / "planner"), weights(alone))
    assert {s["role"] for s in shared_steps} == {None}
    assert [s["role"] for s in steps] == ["solver", "solver", "planner"]  # ceil(3 / 2) updates, then ceil(2 / 2)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert metrics["n_rows"] == 5 and set(metrics["passes"]) == {"solver", "planner"}
    assert metrics["passes"]["solver"]["n_rows"] == 3 and metrics["carried"] == []

    later, metrics, _, ctx = trained("own", "train.adapters=per_role", iteration=2, adapter=str(own), roles=("solver",))
    assert metrics["carried"] == ["planner"]
    assert same(weights(later / "roles" / "planner"), weights(own / "roles" / "planner"))
    assert not same(weights(later), weights(own))
    assert ctx.adapter_for(Role.PLANNER) == str(own / "roles" / "planner")
    assert ctx.adapter_for(Role.CRITIC) is None and ctx.adapter_for(Role.SOLVER) == str(own)


def test_per_role_adapters_need_the_solver_trained():
    import pytest

    from sage.configs import ConfigError

    with pytest.raises(ConfigError, match=r"train.adapters per_role makes the Solver's adapter the checkpoint.*add "
                                          r"solver to train.roles"):
        load_config(overrides=["train.adapters=per_role", "train.roles=[planner]"])
    assert load_config(overrides=["train.adapters=per_role", "train.roles=[solver, planner]"])
