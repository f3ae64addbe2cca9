"""`sage serve --register-only` registers its four deployments on a Prefect test server."""

from __future__ import annotations

import asyncio

import typer
from typer.testing import CliRunner

from sage.flows.serve import serve_command


def _cli():
    app = typer.Typer()
    app.command("serve")(serve_command)
    app.command("noop")(lambda: None)  # two commands, so `serve` stays a subcommand as in `sage`
    return app


async def _read(names: list[str]) -> dict:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return {name: await client.read_deployment_by_name(name) for name in names}


def test_serve_registers_four_deployments(prefect_api, tmp_path):
    args = ["serve", "--register-only", "--set", f"run.dir={tmp_path}", "--run", "r1", "--iterations", "7",
            "--cron", "0 */6 * * *"]
    r = CliRunner().invoke(_cli(), args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    names = ["sage-run/evolve", "sage-iteration/iteration", "sage-stage/stage", "sage-eval/eval"]
    found = asyncio.run(_read(names))
    directory = str(tmp_path.resolve())

    evolve = found["sage-run/evolve"]
    assert evolve.parameters["directory"] == directory and evolve.parameters["run_id"] == "r1"
    assert evolve.parameters["iterations"] == 7
    assert [s.schedule.cron for s in evolve.schedules] == ["0 */6 * * *"]
    assert evolve.entrypoint == "sage.flows.evolve.evolve_flow"

    it = found["sage-iteration/iteration"]
    assert it.parameters == {"directory": directory, "run_id": "r1", "iteration": 1} and it.schedules == []

    stage = found["sage-stage/stage"]
    assert stage.parameters["stage"] == "challenge" and stage.parameters["force"] is False
    assert stage.entrypoint == "sage.flows.iteration.stage_flow"

    ev = found["sage-eval/eval"]
    assert ev.parameters["checkpoints"] == ["base", "best"] and ev.parameters["benchmarks"] == ["humaneval", "math500"]
    assert ev.parameters["n"] == 1 and ev.parameters["run_id"] == "r1"
    assert all("sage" in d.tags and "r1" in d.tags for d in found.values())

    # the run is recorded (as `sage run` would), and the warehouse is released for served runs
    from sage.warehouse import Warehouse

    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT count(*) FROM runs WHERE run_id = 'r1'") == 1

    # registering again updates in place: same ids, new defaults
    r = CliRunner().invoke(_cli(), ["serve", "--register-only", "--set", f"run.dir={tmp_path}", "--run", "r1",
                                    "--iterations", "9"])
    assert r.exit_code == 0, r.output
    again = asyncio.run(_read(names))
    assert again["sage-run/evolve"].id == evolve.id and again["sage-run/evolve"].parameters["iterations"] == 9


def test_serve_rejects_a_bad_cron(prefect_api, tmp_path):
    r = CliRunner().invoke(_cli(), ["serve", "--register-only", "--set", f"run.dir={tmp_path}", "--cron", "often"])
    assert r.exit_code == 2 and "cron" in r.output
