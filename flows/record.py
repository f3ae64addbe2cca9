"""Run one stage under the `stage_runs` contract: skip it when done, record running/done/failed with counts,
timings and the error text. This is the only place that decides whether a stage runs.

A stage that is forced, or `stale` (an earlier stage of its iteration was redone), is redone: what it wrote
for the iteration is removed first and written anew, and the stages after it become stale in turn."""

from __future__ import annotations

import signal
import time
import traceback
from typing import Callable

from sage.stages.context import StageContext, StageReport
from sage.warehouse.errors import is_interrupt
from sage.warehouse.queries import mark_stage_finished, mark_stage_running, stage_status
from sage.warehouse.redo import forget_outputs, mark_later_stale


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the batch in flight is dropped (the warehouse contract makes that safe) and
    the command stops; `signum` decides its exit code (128 + signum). `received` remembers, for this process,
    that one arrived: whatever exception the engines or Prefect make of it on its way up, it ends things as
    `interrupted`."""

    received: int | None = None

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        Interrupted.received = signum


def ended(exc: BaseException) -> str:
    """The status a stage, iteration or run ends in when `exc` stops it."""
    from prefect.exceptions import TerminationSignal  # Prefect's own form of a SIGTERM inside a flow run

    interrupted = Interrupted.received is not None or is_interrupt(exc) or isinstance(exc, TerminationSignal)
    return "interrupted" if interrupted else "failed"


def run_recorded(ctx: StageContext, stage: str, fn: Callable[[StageContext], StageReport], *,
                 run_id: str, iteration: int, force: bool = False) -> StageReport | None:
    """Run `fn(ctx)` unless `stage` is already done for (run_id, iteration); None when skipped. A redone stage's
    report names the stages it made stale (`info["stale"]`)."""
    if Interrupted.received is not None:  # a signal whose exception was swallowed (raised inside a __del__)
        raise Interrupted(Interrupted.received)
    status = stage_status(ctx.wh, run_id, iteration, stage)
    if status == "done" and not force:
        return None
    stale = []
    if force or status == "stale":
        forget_outputs(ctx.wh, run_id, iteration, stage)
        stale = mark_later_stale(ctx.wh, run_id, iteration, stage)
    mark_stage_running(ctx.wh, run_id, iteration, stage)
    start = time.perf_counter()
    try:
        report = fn(ctx)
    except BaseException as e:
        error = "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
        mark_stage_finished(ctx.wh, run_id, iteration, stage, ended(e), None, None,
                            time.perf_counter() - start, error)
        raise
    mark_stage_finished(ctx.wh, run_id, iteration, stage, "done", report.rows_in, report.rows_out,
                        time.perf_counter() - start, None)
    ctx.wh.checkpoint()  # the stage's rows move from the write-ahead log into the file
    if stale:
        report.info["stale"] = stale
    return report
