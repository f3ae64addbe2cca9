"""Run one stage under the `stage_runs` contract: skip it when done, record running/done/failed with counts,
timings and the error text. This is the only place that decides whether a stage runs."""

from __future__ import annotations

import time
import traceback
from typing import Callable

from sage.stages.context import StageContext, StageReport
from sage.warehouse.queries import mark_stage_finished, mark_stage_running, stage_status


def run_recorded(ctx: StageContext, stage: str, fn: Callable[[StageContext], StageReport], *,
                 run_id: str, iteration: int, force: bool = False) -> StageReport | None:
    """Run `fn(ctx)` unless `stage` is already done for (run_id, iteration); None when skipped."""
    if not force and stage_status(ctx.wh, run_id, iteration, stage) == "done":
        return None
    mark_stage_running(ctx.wh, run_id, iteration, stage)
    start = time.perf_counter()
    try:
        report = fn(ctx)
    except BaseException as e:
        error = "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
        mark_stage_finished(ctx.wh, run_id, iteration, stage, "failed", None, None,
                            time.perf_counter() - start, error)
        raise
    mark_stage_finished(ctx.wh, run_id, iteration, stage, "done", report.rows_in, report.rows_out,
                        time.perf_counter() - start, None)
    return report
