"""`sage run`: seeds if needed, validates the base model, then iterations, each a `sage-iteration` subflow,
with validation, best-checkpoint selection and early stopping.

Iteration k generates with the adapter iteration k - 1 produced. The `validate` stage scores the base model
before iteration 1 (recorded as iteration 0) and the adapter of iteration k after every `validate.every`-th
iteration and after the last one. After each validation the checkpoint with the highest val_accuracy
(ties: the earliest) is marked `is_best`, and the run stops early once `validate.patience` validations in a
row have not beaten the best (only while training is on: with `train.enabled` false every validation
scores the same base model, so it is recorded but never stops the run). After each iteration (and its
validation) checkpoint retention (`train.keep_last`, `stages.train.retain`) deletes the adapters and optimizer
states its rule no longer keeps. Without validation questions in the
warehouse the run validates nothing and never stops early (a warning says so). A run id names a config:
running the same command again resumes the run where it stopped, redoes nothing that is done, and takes the
best/stop decisions again from the warehouse (an early-stopped run stops again at the same iteration).
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NONE

from sage.configs.names import Stage
from sage.flows import session
from sage.flows.artifacts import artifact_key
from sage.flows.iteration import SKIPPED, iteration_flow, stage_task, summary_line
from sage.flows.record import ended, publish, run_recorded
from sage.stages import seed as seed_stage
from sage.stages import train as train_stage
from sage.warehouse.queries import set_run_status
from sage.warehouse.validate_queries import count_validation_questions, mark_best, validation_history


@dataclass
class StopDecision:
    stop: bool
    best_iteration: int | None
    best_accuracy: float | None
    since_best: int            # validations after the best one, none of which beat it
    reason: str


def stop_decision(history: list[tuple[int, float]], patience: int) -> StopDecision:
    """Early stopping over (iteration, val_accuracy) in iteration order: the best is the first maximum, and
    the run stops once `patience` later validations have not been strictly better."""
    if not history:
        return StopDecision(False, None, None, 0, "no validation yet")
    best_at = max(range(len(history)), key=lambda i: (history[i][1], -i))
    best_iteration, best = history[best_at]
    since = len(history) - 1 - best_at
    stop = since >= patience
    reason = (f"validation accuracy has not improved on {best:.4f} (iteration {best_iteration}) for {since} "
              f"validation(s) (validate.patience={patience})")
    return StopDecision(stop, best_iteration, best, since, reason)


def validates_after(k: int, every: int, last: int) -> bool:
    return k % every == 0 or k == last


def _validate(directory: str, wh, run_id: str, iteration: int, patience: int) -> StopDecision:
    """Validate iteration `iteration` (skipped when done), re-mark the best and decide from the warehouse."""
    stage_task(directory, run_id, iteration, Stage.VALIDATE)
    mark_best(wh, run_id)
    history = validation_history(wh, run_id, upto_iteration=iteration)
    _publish(run_id, iteration, history)
    return stop_decision([(r["iteration"], r["val_accuracy"]) for r in history], patience)


@task(task_run_name="seed", cache_policy=NONE)
def seed_task(directory: str, run_id: str) -> list[str]:
    """Load the seed, validation and benchmark questions unless done (one `seed` row in `stage_runs` per seed
    configuration); returns the seed-file lines skipped as bad."""
    from prefect.states import Completed

    log = get_run_logger()
    with session.opened(directory) as s, s.display.stage(0, Stage.SEED) as shown:
        ctx = s.context(run_id, 0)
        seeded = run_recorded(ctx, Stage.SEED, seed_stage.run, run_id=seed_stage.seeds_key(ctx), iteration=0)
        if seeded is None:
            log.info(SKIPPED)
            shown(SKIPPED)
            return Completed(name="Skipped", message=SKIPPED, data=[])
        skipped = list(seeded.info.get("skipped", []))
        line = summary_line(Stage.SEED, {"rows_in": seeded.rows_in, "rows_out": seeded.rows_out,
                                         **{k: v for k, v in seeded.info.items() if k != "skipped"},
                                         "bad_lines_skipped": len(skipped) or None})
        log.info(line)
        shown(line)
    return skipped


@flow(name="sage-run", flow_run_name="{run_id}")
def evolve_flow(directory: str, run_id: str, iterations: int) -> list[dict]:
    with session.opened(directory) as s:
        return _evolve(s, directory, run_id, iterations)


def _evolve(s: session.Session, directory: str, run_id: str, iterations: int) -> list[dict]:
    log = get_run_logger()
    ctx = s.context(run_id, 0)
    wh, v = s.warehouse, ctx.cfg.validate
    summaries = []
    try:  # a signal right after the run is marked `running` still ends it `interrupted`
        set_run_status(wh, run_id, "running")
        for line in seed_task(directory, run_id, return_state=True).result() or []:
            log.warning(f"seed file: skipped {line}")
        validating = count_validation_questions(wh) > 0
        if not validating:
            log.warning("no validation questions in the warehouse: no validation, best checkpoint or early stopping")
        decision = _validate(directory, wh, run_id, 0, v.patience) if validating else None
        for k in range(1, iterations + 1):
            if decision is not None and decision.stop and ctx.cfg.train.enabled:
                log.info(f"early stop before iteration {k}: {decision.reason}; best checkpoint is iteration "
                         f"{decision.best_iteration}")
                break
            summaries.append(iteration_flow(directory, run_id, k))
            if validating and validates_after(k, v.every, iterations):
                decision = _validate(directory, wh, run_id, k, v.patience)
                log.info(f"validated iteration {k}: best val_accuracy {decision.best_accuracy} at iteration "
                         f"{decision.best_iteration}, {decision.since_best} validation(s) since")
            _retain(s.context(run_id, k))
    except BaseException as e:
        set_run_status(wh, run_id, ended(e))
        with suppress(Exception):   # the copy must not hide why the run ended
            publish(wh, ctx.cfg.run.snapshot)
        raise
    set_run_status(wh, run_id, "done")
    publish(wh, ctx.cfg.run.snapshot)
    _publish_report(wh, run_id)
    return summaries


def _retain(ctx) -> None:
    """Checkpoint retention after iteration `ctx.iteration`, and a log line naming what it deleted."""
    pruned = train_stage.retain(ctx)
    if pruned["adapters"] or pruned["optimizers"]:
        get_run_logger().info(f"checkpoint retention (train.keep_last={ctx.cfg.train.keep_last}): deleted the "
                              f"adapters of iterations {pruned['adapters']} and the optimizer state alone of "
                              f"iterations {pruned['optimizers']}")


def _publish_report(wh, run_id: str) -> None:
    """The run's report (plots and key tables) as Prefect markdown artifacts, so the UI tells the story."""
    from prefect.artifacts import create_markdown_artifact

    from sage.flows.report import report_artifacts

    for key, markdown in report_artifacts(wh, run_id):
        create_markdown_artifact(markdown=markdown, key=key, description=f"SAGE run {run_id}")


def _publish(run_id: str, iteration: int, history: list[dict]) -> None:
    """The validation curve up to `iteration`, as its own artifact (`<run>-validation-<k>`): a table published
    again under one key would be listed on the run page once per version, each looking like the last."""
    rows = [{k: (None if val is None else str(val)) for k, val in r.items()} for r in history]
    create_table_artifact(table=rows, key=artifact_key(run_id, "validation", iteration),
                          description=f"SAGE run {run_id}: validation curve after iteration {iteration} (is_best "
                                      f"marks the checkpoint to export)")
