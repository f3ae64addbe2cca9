"""Run one stage under the `stage_runs` contract: skip it when done, record running/done/failed with counts,
timings and the error text. This is the only place that decides whether a stage runs.

A stage that is forced, or `stale` (an earlier stage of its iteration was redone), is redone: what it wrote
for the iteration is removed first and written anew, and the stages after it become stale in turn. A stage that
would read an adapter or optimizer state checkpoint retention deleted is refused before anything is written."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sage.stages.context import StageContext, StageReport
from sage.warehouse.checkpoints import check_retained
from sage.warehouse.errors import WarehouseUnwritable, is_interrupt
from sage.warehouse.queries import mark_stage_finished, mark_stage_running, stage_status
from sage.warehouse.redo import forget_outputs, mark_later_stale, written_before

#: A stage's context: seeding runs on a `StageContext`, the stages of an iteration on a `RunContext`.
C = TypeVar("C", bound=StageContext)


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


def on_signal(signum: int, frame) -> None:
    """The SIGINT/SIGTERM handler of a command that runs flows: records the signal, then raises `Interrupted`.
    A second signal during the clean-up must not cut it short, so only the first raises."""
    if Interrupted.received is None:
        raise Interrupted(signum)


def handle_signals() -> None:
    """Put `on_signal` back as this process's SIGTERM/SIGINT handler when a command armed it (`armed`). Prefect's
    flow engine installs its own SIGTERM handler for every flow run, which raises without a record; a handler's
    exception raised while Python runs an object finaliser (an asyncio transport's `__del__`) is swallowed, and
    only a recorded signal is still seen at the next batch (`stop_if_interrupted`)."""
    if on_signal.armed and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not on_signal:
                signal.signal(sig, on_signal)


on_signal.armed = False  # True inside `stopped_by_signals`


def quiet_swallowed(hook):
    """A `sys.unraisablehook` that prints nothing for an `Interrupted` that a finaliser swallowed (the signal is
    recorded, and the run stops at the next batch, saying so) and passes everything else to `hook`."""
    def unraisable(u) -> None:
        if not isinstance(u.exc_value, Interrupted):
            hook(u)
    return unraisable


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """For the time of the block, SIGINT and SIGTERM raise `Interrupted` (recorded, put back inside every flow,
    seen at the next batch, silent when a finaliser swallows it); the previous handlers come back after it.
    What a command that runs flows wraps them in (`sage run`, the benchmarks)."""
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    on_signal.armed, hook = True, sys.unraisablehook
    sys.unraisablehook = quiet_swallowed(hook)
    try:
        yield
    finally:
        Interrupted.received, on_signal.armed, sys.unraisablehook = None, False, hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_if_interrupted() -> None:
    """Raise `Interrupted` when a signal arrived whose exception was swallowed on its way up (see `handle_signals`);
    called before each stage and after each batch a stage reports."""
    if Interrupted.received is not None and threading.current_thread() is threading.main_thread():
        raise Interrupted(Interrupted.received)


def ended(exc: BaseException) -> str:
    """The status a stage, iteration or run ends in when `exc` stops it."""
    from prefect.exceptions import TerminationSignal  # Prefect's own form of a SIGTERM inside a flow run

    interrupted = Interrupted.received is not None or is_interrupt(exc) or isinstance(exc, TerminationSignal)
    return "interrupted" if interrupted else "failed"


def run_recorded(ctx: C, stage: str, fn: Callable[[C], StageReport], *,
                 run_id: str, iteration: int, force: bool = False) -> StageReport | None:
    """Run `fn(ctx)` unless `stage` is already done for (run_id, iteration); None when skipped. A redone stage's
    report names the stages it made stale (`info["stale"]`)."""
    stop_if_interrupted()
    status = stage_status(ctx.wh, run_id, iteration, stage)
    if status == "done" and not force:
        return None
    check_retained(ctx.wh, run_id, iteration, stage)  # what it reads was not deleted: before anything is written
    stale = []
    if force or status == "stale":
        forget_outputs(ctx.wh, run_id, iteration, stage)
        stale = mark_later_stale(ctx.wh, run_id, iteration, stage)
    # a resumed stage writes only what its earlier attempts did not: its counts cover them all
    earlier = written_before(ctx.wh, run_id, iteration, stage) if status is not None else 0
    start = time.perf_counter()
    try:  # from before the row says `running`: a signal at any point after it (even before `fn`) ends it
        mark_stage_running(ctx.wh, run_id, iteration, stage)
        report = fn(ctx)
    except BaseException as e:
        error = "".join(traceback.format_exception_only(type(e), e)).strip()[-2000:]
        mark_stage_finished(ctx.wh, run_id, iteration, stage, ended(e), None, None,
                            time.perf_counter() - start, error)
        raise
    if earlier and report.rows_out is not None:
        report.rows_out += earlier
    mark_stage_finished(ctx.wh, run_id, iteration, stage, "done", report.rows_in, report.rows_out,
                        time.perf_counter() - start, None)
    publish(ctx.wh, ctx.cfg.run.snapshot)  # the stage's rows move from the write-ahead log into the file
    if stale:
        report.info["stale"] = stale
    return report


def publish(wh, snapshot: bool) -> None:
    """Checkpoint the warehouse and, with `run.snapshot`, refresh its read-only copy for other DuckDB clients
    (`Warehouse.snapshot`). A checkpoint that fails (a full disk) fails the stage; a copy that cannot be written is
    said in the log (which file, how much space it needs) and fails nothing: the part copy is removed, so it takes
    no space the next commit needs, and the warehouse itself is committed."""
    wh.checkpoint()
    if not snapshot:
        return
    try:
        wh.snapshot()
    except (OSError, WarehouseUnwritable) as e:
        logging.getLogger(__name__).warning("the warehouse's read-only copy was not refreshed: %s", e)
