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
    assert r.exit_code == 2 and "iteration.alpha: 0.7 -> 0.9" in said(r) and "--run NAME" in said(r)

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
    from sage.warehouse.runs import IterationNotFound, check_stage_target

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
