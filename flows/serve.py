"""`sage serve`: register the flows as Prefect deployments on a running server and run what the UI triggers.

Four deployments, each with default parameters for one run (edit them in the UI's "Custom run"):

- `sage-run/evolve`: the whole run (`sage.flows.evolve.evolve_flow`), optionally on a cron schedule;
- `sage-iteration/iteration`: one iteration (`iteration_flow`); stages already done are skipped;
- `sage-stage/stage`: one stage of one iteration (`stage_flow`), to re-run a failed stage;
- `sage-eval/eval`: benchmarks for base and best (`sage.flows.evaluate.eval_flow`).

Served flow runs execute in child processes of this one, one at a time (`limit=1`): DuckDB allows one
writer, so this process closes the warehouse before serving and never holds it while a flow runs. Needs
a server (`prefect server start`) and `PREFECT_API_URL` pointing at it; without one, Prefect would start a
throwaway server that the UI never sees.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

DEPLOYMENTS = ("evolve", "iteration", "stage", "eval")


def _accepted(fn, params: dict[str, Any]) -> dict[str, Any]:
    """Keep only the parameters the flow's function takes (flows gain parameters over time)."""
    names = inspect.signature(fn).parameters
    return {k: v for k, v in params.items() if k in names}


def build_deployments(directory: str, run_id: str, iterations: int, cron: str | None = None) -> list:
    """The four RunnerDeployments (not yet registered) for run `run_id` in project `directory`."""
    from prefect.types.entrypoint import EntrypointType

    from sage.flows.evaluate import DEFAULT_BENCHMARKS, DEFAULT_CHECKPOINTS, eval_flow
    from sage.flows.evolve import evolve_flow
    from sage.flows.iteration import STAGE_NAMES, iteration_flow, stage_flow

    common = {"directory": directory, "run_id": run_id}
    specs = [
        ("evolve", evolve_flow, {**common, "iterations": iterations}, cron,
         f"Run {run_id}: seed if needed, then {iterations} iteration(s); resumes where it stopped."),
        ("iteration", iteration_flow, {**common, "iteration": 1}, None,
         "One iteration of a run; stages already done are skipped, so a retry redoes only what is missing."),
        ("stage", stage_flow, {**common, "iteration": 1, "stage": STAGE_NAMES[0], "force": False}, None,
         f"Re-run one stage of one iteration (stages: {', '.join(STAGE_NAMES)}); force redoes a finished one."),
        ("eval", eval_flow, {**common, "checkpoints": list(DEFAULT_CHECKPOINTS), "benchmarks": list(DEFAULT_BENCHMARKS),
                             "limit": None, "n": 1, "k": None}, None,
         "Benchmarks (greedy pass@1; pass@k with n > 1) for base and checkpoints, into `evaluations`."),
    ]
    # Module-path entrypoints: served runs import `sage.flows.evolve` etc. from the installed package, whatever
    # the working directory.
    return [fl.to_deployment(name=name, parameters=_accepted(fl.fn, params), cron=schedule, description=text,
                             tags=["sage", run_id], entrypoint_type=EntrypointType.MODULE_PATH)
            for name, fl, params, schedule, text in specs]


def _api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def _check_cron(cron: str | None) -> None:
    if cron is None:
        return
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise ValueError(f"--cron {cron!r} is not a cron expression; e.g. '0 */6 * * *' (every 6 hours)") from None


def serve_command(
        config: Annotated[str, typer.Option("--config", "-c", help="Profile name in configs/ (cpu, paper-7b) or a "
                                            "YAML path.")] = "cpu",
        set_: Annotated[list[str] | None, typer.Option("--set", help="Override one field: section.field=value "
                                                       "(repeatable).")] = None,
        run_id: Annotated[str | None, typer.Option("--run", help="Run the deployments default to (default: "
                                                   "run-<config hash>, as `sage run`).")] = None,
        iterations: Annotated[int | None, typer.Option("--iterations", "-n", help="Iterations the evolve deployment "
                                                       "runs (default: run.iterations).")] = None,
        cron: Annotated[str | None, typer.Option("--cron", help="Schedule the evolve deployment, e.g. '0 */6 * * *' "
                                                 "(a run resumes, so each tick continues it).")] = None,
        register_only: Annotated[bool, typer.Option("--register-only", help="Create or update the deployments and "
                                                    "return, without serving them.")] = False,
) -> None:
    """Register Prefect deployments (evolve, iteration, stage, eval) on a running server and serve them."""
    from sage.configs import load_config
    from sage.flows.session import Session
    from sage.flows.terminal import console, fail

    url = _api_url()
    if not url:
        fail("no Prefect server: start one with `prefect server start --host 127.0.0.1` and set "
             "PREFECT_API_URL=http://127.0.0.1:4200/api (or `prefect config set PREFECT_API_URL=...`)")
    from sage.flows.api_server import PrefectUnreachable, check_api

    try:
        check_api(url)
    except PrefectUnreachable as e:
        fail(str(e))
    try:
        _check_cron(cron)
        cfg = load_config(config, set_ or [])
        directory = str(Path(cfg.run.dir).expanduser().resolve())
        with Session(directory) as s:  # closed before serving: served runs open the warehouse in their own processes
            rid = s.create_run(cfg, run_id)
    except ValueError as e:  # a bad cron expression
        fail(str(e))
    deployments = build_deployments(directory, rid, iterations or cfg.run.iterations, cron)
    if register_only:
        for d in deployments:
            d.apply()
        for d in deployments:
            console.print(f"registered {d.flow_name}/{d.name}"
                          + (f" (cron {cron})" if d.name == "evolve" and cron else ""))
        console.print(f"start them from the UI ({url.removesuffix('/api')}) once `sage serve` is running")
        return
    from prefect import serve

    console.print(f"serving run {rid} ({directory}) on {url}; open the UI at {url.removesuffix('/api')} "
                  f"and trigger a deployment. Ctrl-C stops serving.")
    serve(*deployments, limit=1)
