"""One SAGE iteration as a Prefect flow: the stages in SAGE.md's order, one task each.

The flow holds the control flow; stages compute. Idempotency lives in the warehouse: a stage recorded
`done` in `stage_runs` is skipped, so re-running the flow after a crash or a failure redoes only what is
missing, and re-running it after success changes no row. `stage_flow` re-runs exactly one stage.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.states import Completed, State

from sage.configs.names import ITERATION_STAGES, Stage
from sage.flows import session
from sage.flows.artifacts import artifact_key
from sage.flows.record import ended, run_recorded
from sage.flows.samples import samples_markdown
from sage.flows.terminal import cell
from sage.stages import admit, challenge, critique, plan, score, solve, train, validate, verify
from sage.stages.context import RunContext, StageReport
from sage.warehouse.queries import (
    finish_iteration,
    iteration_samples,
    iteration_states,
    iteration_summary,
    start_iteration,
)
from sage.warehouse.redo import later_iterations, stale_stages
from sage.warehouse.runs import check_stage_target

# What each stage of the iteration runs; `ITERATION_STAGES` (configs/names.py) gives their order, SAGE.md's.
_RUNS: dict[Stage, Callable[[RunContext], StageReport]] = {
    Stage.CHALLENGE: challenge.run, Stage.CRITIQUE_QUESTION: critique.run_questions, Stage.PROBE: solve.run_probe,
    Stage.VERIFY_PROBE: verify.run_probe, Stage.ADMIT: admit.run, Stage.PLAN: plan.run,
    Stage.CRITIQUE_PLAN: critique.run_plans, Stage.SOLVE: solve.run_solve, Stage.VERIFY: verify.run_solve,
    Stage.SCORE: score.run, Stage.TRAIN: train.run,
}
# (stage name in stage_runs, function), in the order the flow runs them.
STAGES: tuple[tuple[Stage, Callable[[RunContext], StageReport]], ...] = tuple(
    (name, _RUNS[name]) for name in ITERATION_STAGES)
STAGE_NAMES = tuple(name for name, _ in STAGES)
# Run outside the per-iteration order: validation of iteration k's adapter (0 = the base model), which
# flows/evolve.py schedules every `validate.every` iterations.
EXTRA_STAGES: dict[Stage, Callable[[RunContext], StageReport]] = {Stage.VALIDATE: validate.run}
RUNNABLE = {**dict(STAGES), **EXTRA_STAGES}
# The stages `stage_flow` runs, as the type of its `stage` parameter: the Prefect UI offers them as a list and a
# deployment run given another name is refused before the flow starts, in one sentence naming the valid ones.
RunnableStage = StrEnum("RunnableStage", {name.name: name.value for name in RUNNABLE}, module=__name__)

_TRANSIENT = (ConnectionError, TimeoutError, BrokenPipeError, MemoryError)


def _transient(task, task_run, state) -> bool:
    """Retry engine hiccups (lost workers, timeouts, out of memory), not bugs or bad data."""
    try:
        state.result()
    except _TRANSIENT:
        return True
    except RuntimeError as e:
        return "out of memory" in str(e).lower()
    except BaseException:
        return False
    return False


#: What a stage found done in the warehouse logs, and the name of the state its task run ends in.
SKIPPED = "skipped: done in warehouse"


def summary_line(name: str, result: dict) -> str:
    """One line of what a stage did: rows in and out, then its key numbers (floats to 4 significant digits,
    control characters escaped)."""
    numbers = ", ".join(f"{k} {cell(v)}" for k, v in result.items()
                        if k not in ("rows_in", "rows_out") and v is not None)
    return f"{name}: {result['rows_in']} in, {result['rows_out']} out" + (f"; {numbers}" if numbers else "")


@task(task_run_name="{name}", retries=2, retry_delay_seconds=5, retry_condition_fn=_transient, cache_policy=NONE)
def stage_task(directory: str, run_id: str, iteration: int, name: str, force: bool = False) -> dict | State:
    """Run stage `name` of (run, iteration) under the `stage_runs` contract, in the flow's session, and log one
    summary line. A stage found done ends in a `Skipped` state (a Completed type the UI shows by that name)."""
    with session.opened(directory) as s, s.display.stage(iteration, name) as shown:
        report = run_recorded(s.context(run_id, iteration), name, RUNNABLE[name], run_id=run_id,
                              iteration=iteration, force=force)
        if report is None:
            get_run_logger().info(SKIPPED)
            shown(SKIPPED)
            return Completed(name="Skipped", message=SKIPPED)
        result = {"rows_in": report.rows_in, "rows_out": report.rows_out, **report.info}
        line = summary_line(name, result)
        get_run_logger().info(line)
        shown(line)
    return result


def stage_result(value: dict | State) -> dict | None:
    """What `stage_task` returned: its counts and numbers, or None for a skipped stage."""
    return None if isinstance(value, State) else value


@flow(name="sage-iteration", flow_run_name="{run_id}-iteration-{iteration}")
def iteration_flow(directory: str, run_id: str, iteration: int) -> dict:
    """Run every stage of one iteration that is not done yet; publish its numbers as a table artifact."""
    with session.opened(directory) as s:
        wh = s.warehouse
        stale = stale_stages(wh, run_id, iteration)
        if stale:
            get_run_logger().warning(f"iteration {iteration}: redoing stale stage(s) {', '.join(stale)} (an earlier "
                                     f"stage was redone with `sage stage --force`)")
        adapter = s.context(run_id, iteration).adapter
        try:  # a signal right after the iteration is marked `running` still ends it `interrupted`
            start_iteration(wh, run_id, iteration, adapter)
            for name in STAGE_NAMES:
                stage_task(directory, run_id, iteration, name)
        except BaseException as e:
            finish_iteration(wh, run_id, iteration, ended(e))
            raise
        finish_iteration(wh, run_id, iteration, "done")
        summary = iteration_summary(wh, run_id, iteration)
        samples = iteration_samples(wh, run_id, iteration)
    _publish(run_id, iteration, summary, samples)
    return summary


@flow(name="sage-stage", flow_run_name="{run_id}-iteration-{iteration}-{stage}")
def stage_flow(directory: str, run_id: str, iteration: int, stage: RunnableStage,
               force: bool = False) -> dict | None:
    """Re-run exactly one stage of one iteration (`force` redoes a finished one)."""
    if stage not in RUNNABLE:
        raise ValueError(f"unknown stage {stage!r}; one of {', '.join(RUNNABLE)}")
    with session.opened(directory) as s:
        wh = s.warehouse
        check_stage_target(wh, run_id, iteration, stage, force)  # before anything is written
        if stage in STAGE_NAMES and iteration not in iteration_states(wh, run_id):
            start_iteration(wh, run_id, iteration, s.context(run_id, iteration).adapter)
        result = stage_result(stage_task(directory, run_id, iteration, stage, force=force))
        later = later_iterations(wh, run_id, iteration) if force and stage != Stage.VALIDATE else []
    if result and result.get("stale"):
        get_run_logger().warning(f"{stage} of iteration {iteration} was redone: {', '.join(result['stale'])} "
                                 f"are stale and the next `sage run` redoes them")
    if later:
        get_run_logger().warning(f"iterations {', '.join(map(str, later))} generated with adapters that follow from "
                                 f"iteration {iteration}; they are not redone (start a new run with --run NAME to "
                                 f"train from the changed iteration)")
    return result


def _publish(run_id: str, iteration: int, summary: dict[str, list[dict]], samples: list[dict]) -> None:
    """One table artifact per concept (questions, plans, solver, roles, training), values as stored (numbers
    stay numbers), and a markdown artifact with a few generations of each role."""
    for name, table in summary.items():
        create_table_artifact(table=table, key=artifact_key(run_id, "iteration", iteration, name),
                              description=f"SAGE run {run_id}, iteration {iteration}: {name}")
    create_markdown_artifact(markdown=samples_markdown(iteration, samples),
                             key=artifact_key(run_id, "iteration", iteration, "samples"),
                             description=f"SAGE run {run_id}, iteration {iteration}: sample generations per role")
