"""Runs as users expect them: `sage run` extends a run with more iterations (`--set run.iterations=N` or `-n N`)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sage.flows import cli
from sage.warehouse import Warehouse
from tests.flows import scripted_run


@pytest.fixture()
def scripted_cli(monkeypatch):
    """`sage` in this process, every flow generating with the scripted generator of scripted_run."""
    real = cli._run_flow

    def run_flow(directory, fn, *args, engines=None):
        return real(directory, fn, *args, engines={"llm": scripted_run.PausingScriptedLLM(None, None)})

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

