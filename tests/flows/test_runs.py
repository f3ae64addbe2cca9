"""Runs as users expect them: `sage run` extends a run with more iterations (`--set run.iterations=N` or `-n N`),
`sage stage` refuses a run or an iteration that does not exist, and any run name works end to end."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sage.flows import cli
from sage.warehouse import Warehouse
from sage.warehouse.runs import run_dirname
from tests.flows import scripted_run
from tests.flows.test_iteration import dump


@pytest.fixture()
def scripted_cli(monkeypatch):
    """`sage` in this process, every flow generating with the scripted generator of scripted_run."""
    real = cli._run_flow

    def run_flow(directory, fn, *args, engines=None, **kw):
        return real(directory, fn, *args, engines={"llm": scripted_run.PausingScriptedLLM(None, None)}, **kw)

    monkeypatch.setattr(cli, "_run_flow", run_flow)
    return lambda *args: CliRunner().invoke(cli.app, [str(a) for a in args])


def said(r) -> str:
    """The command's output with the terminal's line wrapping undone."""
    return " ".join(r.output.split())


def sage_run(invoke, directory, *args):
    sets = [x for s in [f"run.dir={directory}", *scripted_run.OVERRIDES] for x in ("--set", s)]
    return invoke("run", *sets, *args)


def iterations(directory) -> list[tuple]:
    with Warehouse.open(directory / "warehouse.duckdb", read_only=True) as wh:
        return [tuple(r.values()) for r in wh.rows("SELECT run_id, iteration, status FROM iterations ORDER BY ALL")]


def test_more_iterations_extend_the_same_run(prefect_api, scripted_cli, tmp_path):
    rid = scripted_run.prepare(tmp_path, None)  # the default id: run-<identity hash>
    r = sage_run(scripted_cli, tmp_path, "-n", 1)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert f"run {rid}:" in said(r) and iterations(tmp_path) == [(rid, 1, "done")]
    r = sage_run(scripted_cli, tmp_path, "--set", "run.iterations=2", "--set", "run.batch_rows=3")
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert iterations(tmp_path) == [(rid, 1, "done"), (rid, 2, "done")]
    r = sage_run(scripted_cli, tmp_path, "-n", 3, "--set", "validate.every=1")
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert iterations(tmp_path) == [(rid, k, "done") for k in (1, 2, 3)]
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.count("runs") == 1

    # a field that decides rows: refused with what differs and how to start a new run instead
    r = sage_run(scripted_cli, tmp_path, "--run", rid, "--set", "iteration.alpha=0.9")
    assert r.exit_code == 2 and "iteration.alpha: 0.3 -> 0.9" in said(r) and "--run NAME" in said(r)

    # sage stage: a missing iteration or run is refused, naming what exists, and writes nothing
    before = dump(tmp_path)
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        stage_runs = wh.count("stage_runs")
    r = scripted_cli("stage", "verify", "--run", rid, "-i", 9, "--dir", tmp_path)
    assert r.exit_code == 2 and "no iteration 9" in said(r) and "1 (done), 2 (done), 3 (done)" in said(r)
    r = scripted_cli("stage", "challenge", "--run", rid, "-i", 0, "--dir", tmp_path)
    assert r.exit_code == 2 and "no iteration 0" in said(r) and "validate also takes iteration 0" in said(r)
    r = scripted_cli("stage", "validate", "--run", rid, "-i", 4, "--dir", tmp_path)
    assert r.exit_code == 2 and "no iteration 4" in said(r)
    r = scripted_cli("stage", "verify", "--run", "nope", "-i", 1, "--dir", tmp_path)
    assert r.exit_code == 2 and "no run 'nope'" in said(r) and rid in said(r)
    assert dump(tmp_path) == before and iterations(tmp_path) == [(rid, k, "done") for k in (1, 2, 3)]
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.count("stage_runs") == stage_runs


def test_a_stage_may_start_the_next_iteration_once_the_last_is_done(prefect_api, scripted_cli, tmp_path):
    from sage.flows.session import Session
    from sage.warehouse.queries import finish_iteration, start_iteration
    from sage.warehouse.runs import IterationNotFound, StageInputsMissing, check_stage_target

    rid = scripted_run.prepare(tmp_path, "next")
    with Session(tmp_path) as s:
        wh = s.warehouse
        check_stage_target(wh, rid, 1, "challenge")       # a run without iterations starts iteration 1
        check_stage_target(wh, rid, 0, "validate")        # the base model
        start_iteration(wh, rid, 1, None)
        with pytest.raises(IterationNotFound, match="iteration 2 can start once iteration 1 is done"):
            check_stage_target(wh, rid, 2, "challenge")
        finish_iteration(wh, rid, 1, "done")
        check_stage_target(wh, rid, 2, "challenge")
        with pytest.raises(StageInputsMissing, match=r"train \(never run\)"):  # validation reads its adapter
            check_stage_target(wh, rid, 1, "validate")


NAME = "exp.1/a b:c"


def test_any_run_name_finishes_and_resumes(prefect_api, scripted_cli, tmp_path):
    from prefect.artifacts import Artifact

    scripted_run.run(tmp_path, 2, run_id=NAME)
    assert iterations(tmp_path) == [(NAME, 1, "done"), (NAME, 2, "done")]
    assert Artifact.get("exp-1-a-b-c-iteration-2-questions") is not None
    before = dump(tmp_path)
    scripted_run.run(tmp_path, 2, run_id=NAME)
    assert dump(tmp_path) == before and iterations(tmp_path) == [(NAME, 1, "done"), (NAME, 2, "done")]

    r = scripted_cli("report", "--run", NAME, "--dir", tmp_path)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert [p.name for p in (tmp_path / "reports").iterdir()] == [run_dirname(NAME)]
    assert (tmp_path / "reports" / run_dirname(NAME) / "index.html").exists()


@pytest.mark.parametrize("name", ["scripted", "run-3f2a9c1d", "my_run.v2"])
def test_plain_run_names_are_their_own_directory(name):
    assert run_dirname(name) == name


@pytest.mark.parametrize("name", [NAME, "../up", "..", "/abs/path", "a\\b", "x y", "."])
def test_other_run_names_map_to_one_safe_directory(name, tmp_path):
    d = run_dirname(name)
    assert "/" not in d and "\\" not in d and d not in (".", "..") and not d.startswith(".")
    assert (tmp_path / d).resolve().parent == tmp_path.resolve()
    assert d != run_dirname(name + "!")  # two names never share a directory


def test_a_stage_without_its_inputs_is_refused_and_the_next_run_verifies_every_answer(prefect_api, scripted_cli,
                                                                                       tmp_path):
    rid = scripted_run.prepare(tmp_path, None)
    assert sage_run(scripted_cli, tmp_path, "-n", 1).exit_code == 0
    before = dump(tmp_path)
    for name in ("verify", "score", "train"):  # iteration 2 has no answers yet: refused, nothing written
        r = scripted_cli("stage", name, "--run", rid, "-i", 2, "--dir", tmp_path)
        assert r.exit_code == 2, r.output + repr(r.exception)
        assert f"stage {name} of run '{rid}' iteration 2" in said(r) and "challenge (never run)" in said(r)
        assert f"sage stage challenge --run {rid} --iteration 2" in said(r) and "nothing was written" in said(r)
    assert dump(tmp_path) == before and iterations(tmp_path) == [(rid, 1, "done")]

    r = sage_run(scripted_cli, tmp_path, "-n", 2)
    assert r.exit_code == 0, r.output + repr(r.exception)
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        answers = wh.scalar("SELECT count(*) FROM rollouts WHERE iteration = 2 AND purpose = 'solve'")
        verified = wh.scalar("SELECT count(*) FROM rollouts r JOIN verdicts v USING (rollout_id) "
                             "WHERE r.iteration = 2 AND r.purpose = 'solve'")
        assert answers > 0 and verified == answers
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:  # a solve that stopped half way: verify waits
        wh.execute("UPDATE stage_runs SET status = 'interrupted' WHERE run_id = ? AND iteration = 2 "
                   "AND stage = 'solve'", [rid])
    r = scripted_cli("stage", "verify", "--run", rid, "-i", 2, "--dir", tmp_path, "--force")
    assert r.exit_code == 2 and "solve (interrupted)" in said(r) and "sage stage solve" in said(r)


def test_a_copied_project_trains_into_itself_and_works_without_the_original(prefect_api, scripted_cli, tmp_path,
                                                                           monkeypatch):
    """Adapter paths are stored relative to the project directory: `sage stage train --force` in a copy writes the
    copy's adapter (the original's stays as it was), and the copy works with the original gone."""
    import json
    import shutil

    from sage.engines.llm import models
    from sage.engines.train import launch
    from sage.warehouse.checkpoints import resolve_checkpoint

    made = {"by": "original"}

    def fake_train(model_path, adapter_in, adapter_out, rows, cfg, **kw):  # scripted token ids: no real trainer
        from pathlib import Path

        Path(adapter_out).mkdir(parents=True)
        (Path(adapter_out) / "adapter_config.json").write_text(json.dumps({"made": made["by"], "rows": len(rows)}))
        return {"loss": 0.5}

    monkeypatch.setattr(launch, "train", fake_train)
    monkeypatch.setattr(models, "resolve_model", lambda name, cache_dir=None: "scripted-model")
    original, copy = tmp_path / "original", tmp_path / "elsewhere" / "copy"
    scripted_run.prepare(original, extra=["train.enabled=true"])
    scripted_run.run(original)
    adapter = original / "adapters" / "scripted" / "iteration-1" / "adapter_config.json"
    assert json.loads(adapter.read_text())["made"] == "original"
    with Warehouse.open(original / "warehouse.duckdb", read_only=True) as wh:
        stored = wh.rows("SELECT i.adapter_out, c.adapter_path FROM iterations i JOIN checkpoints c USING (run_id, "
                         "iteration) WHERE run_id = 'scripted' AND iteration = 1")
        assert stored == [{"adapter_out": "adapters/scripted/iteration-1",
                           "adapter_path": "adapters/scripted/iteration-1"}]
    shutil.copytree(original, copy)
    before = dump(original)

    made["by"] = "copy"
    r = scripted_cli("stage", "train", "--run", "scripted", "-i", 1, "--force", "--dir", copy)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert json.loads(adapter.read_text())["made"] == "original" and dump(original) == before
    copied = copy / "adapters" / "scripted" / "iteration-1" / "adapter_config.json"
    assert json.loads(copied.read_text())["made"] == "copy"

    shutil.rmtree(original)
    with Warehouse.open(copy / "warehouse.duckdb", read_only=True) as wh:
        assert resolve_checkpoint(wh, "scripted", "latest").adapter == str(copied.parent.resolve())
    r = scripted_cli("export", "--run", "scripted", "--checkpoint", "1", "--dir", copy, "--dest", tmp_path / "out")
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert json.loads((tmp_path / "out" / "adapter_config.json").read_text())["made"] == "copy"


def test_an_adapter_path_stored_absolute_stays_absolute(tmp_path):
    from sage.warehouse.queries import iteration_adapter, located_path, start_iteration, stored_path

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        assert located_path(wh, "/old/project/adapters/r/iteration-1") == "/old/project/adapters/r/iteration-1"
        assert located_path(wh, "adapters/r/iteration-1") == str(tmp_path.resolve() / "adapters/r/iteration-1")
        assert stored_path(wh, tmp_path / "adapters" / "r") == "adapters/r"
        assert stored_path(wh, "/somewhere/else") == "/somewhere/else"
        start_iteration(wh, "r", 1, None)
        wh.execute("UPDATE iterations SET adapter_out = '/old/project/adapters/r/iteration-1'")
        assert iteration_adapter(wh, "r", 1) == "/old/project/adapters/r/iteration-1"
