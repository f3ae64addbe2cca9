"""What `sage run`, `sage stage` and `sage eval` show while they work, owned by the CLI.

On a terminal, a live region at the bottom: a header (run, `iteration k/n`, time so far) and one bar per
(iteration, stage) in flight with rows done, tokens per second and ETA (training counts optimizer steps and
shows the last update's loss), on one line at any width from 80 columns (under `WIDE` the bar is short and the
label is the stage's name: the header names the iteration); a stage that does not report progress (scoring,
admission) shows an indeterminate bar with its elapsed time. Rate and ETA are measured from a stage's first
report (generation reports 0 rows before its first batch; training its first optimizer step, after the model
has loaded), so setup time does not skew them. A finished stage's line gives one throughput: its own
`tokens_per_s` where it reports one (training), else the rate the bar measured. When a stage ends, its bar is
printed above the live region with its summary (rows in/out, key numbers) and leaves it, so the region stays a
few lines high and each (iteration, stage) keeps its own bar: iteration 2 never reuses iteration 1's.

Everything else that writes to the terminal while the region is live goes above it: log records (Prefect's
console handler and any other handler writing to stderr/stdout are swapped for one that prints through the
same console, with control characters escaped since log text can carry model output), and stray prints
(rich redirects stdout/stderr). transformers' tqdm bars ("Loading weights") are switched off meanwhile: a
carriage-return bar cannot share a terminal with a live region.

Without a terminal (nohup, tee, CI) there is no live region: one plain line per finished stage,
`iteration k stage: rows in/out; key numbers (seconds)`, printed as it ends. Log records below WARNING are
shown only with `verbose` (the stage lines say what the INFO records would); `quiet` shows no progress at all.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

from sage.flows.terminal import plain

LIVE, LINES, QUIET = "live", "lines", "quiet"
WIDE = 110   # columns from which a stage's bar is long and its label names the iteration


class _Rows(ProgressColumn):
    """`12/20 rows` while rows are counted, nothing for a stage that does not count them."""

    def render(self, task: Task) -> Text:
        return Text(task.fields.get("rows", ""), style="green")


class _Time(ProgressColumn):
    """`ETA 0:04` while a bar's finish can be estimated (its `finish` field, a monotonic time: the ETA counts
    down between reports), else the time it has taken (`1:12`): one column, so a stage's line fits 80 columns."""

    def render(self, task: Task) -> Text:
        finish = None if task.finished else task.fields.get("finish")
        if finish is not None:
            return Text(f"ETA {_clock(max(finish - time.monotonic(), 0))}", style="cyan")
        elapsed = task.finished_time if task.finished else task.elapsed
        return Text(_clock(elapsed or 0), style="yellow")


def _clock(seconds: float) -> str:
    """`m:ss` under an hour, `h:mm:ss` from one."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _tok_s(value: float) -> str:
    return f"{value:,.0f} tok/s"


# a stage summary's own throughput (`summary_line`'s `tokens_per_s N`): the finished line names it once, as tok/s
_OWN_RATE = re.compile(r"(?:(?<=; )|, )tokens_per_s (\d+(?:\.\d*)?(?:e[+-]?\d+)?)")


class _Mark(SpinnerColumn):
    """A spinner while the stage runs, then its `mark` (a green tick, a red cross)."""

    def render(self, task: Task):
        mark = task.fields.get("mark")
        return Text.from_markup(mark) if mark else super().render(task)


class Display:
    """Progress of one command; `mode` is LIVE (terminal), LINES (no terminal) or QUIET. Stages report rows
    through `report` (the session binds each context's iteration to it); the flows wrap each stage in
    `stage(iteration, name)`. Entering it routes logging through the console; leaving it restores that."""

    def __init__(self, console: Console | None = None, mode: str | None = None, *, run_id: str | None = None,
                 iterations: int | None = None, verbose: bool = False):
        self.console = console or Console(stderr=True)
        self.mode = mode or (LIVE if self.console.is_terminal else LINES)
        self.run_id, self.iterations, self.verbose = run_id, iterations, verbose
        # One line per stage, never wrapped: under WIDE columns the bar is short and the label the stage's name, so
        # rows, loss, tokens per second and ETA fit 80 columns; what still does not fit is cut with an ellipsis.
        self.wide = self.console.width >= WIDE
        whole = dict(no_wrap=True, overflow="ellipsis")
        self.progress = Progress(_Mark(), TextColumn("{task.description}", table_column=Column(**whole)),
                                 BarColumn(bar_width=24 if self.wide else 8),
                                 _Rows(table_column=Column(min_width=12, justify="right", **whole)),
                                 TextColumn("{task.fields[rate]}", table_column=Column(justify="right", **whole)),
                                 _Time(table_column=Column(justify="right", **whole)), console=self.console)
        # (iteration, name) -> (task id, start, the stage in flight when it appeared: whose part it is)
        self._bars: dict[tuple[int, str], tuple[int, float, tuple[int, str] | None]] = {}
        self._anchors: dict[tuple[int, str], tuple[float, int, int]] = {}  # first report: (time, done, tokens)
        self._lock = threading.Lock()
        self._current: tuple[int, str] | None = None
        self._start = time.monotonic()
        self._live: Live | None = None
        self._undo: list[Callable[[], None]] = []

    # -- what the flows and stages call

    def report(self, iteration: int, stage: str, done: int, total: int, tokens: int = 0, unit: str = "rows",
               note: str = "", metrics: dict | None = None) -> None:
        """`done` of `total` (rows, or the `unit` given: training reports optimizer steps) and `tokens` so far by
        `stage` of `iteration`, with a short `note` shown after the rate (training's loss); ProgressFn's shape
        with the iteration first."""
        if self.mode != LIVE:
            return
        key = (iteration, stage)
        task_id, _, _ = self._bar(iteration, stage)
        now = time.monotonic()
        t0, done0, tokens0 = self._anchors.setdefault(key, (now, done, tokens))
        elapsed = now - t0
        rate, finish = "", None
        if elapsed > 0.5 and tokens > tokens0:
            rate = _tok_s((tokens - tokens0) / elapsed)
        if done > done0 and total > done:  # rows per second since the first report, the rest at that pace
            finish = now + (total - done) * elapsed / (done - done0)
        self.progress.update(task_id, completed=done, total=max(total, 1), rows=f"{done}/{total} {unit}",
                             note=plain(note), tok=rate, rate=plain(" ".join(p for p in (note, rate) if p)),
                             finish=finish)

    @contextmanager
    def stage(self, iteration: int, name: str) -> Iterator[Callable[[str], None]]:
        """Show stage `name` of `iteration` while the block runs. Call the function it yields with the stage's
        summary line (`summary_line` in flows/iteration.py); the stage's bar then ends with it."""
        key = (iteration, name)
        self._current = key
        self._bar(*key)
        summary: list[str] = []
        try:
            yield summary.append
        except BaseException as e:
            self._end(key, _ended(e), ok=False)
            raise
        self._end(key, summary[-1] if summary else "done", ok=True)

    # -- bars

    def _bar(self, iteration: int, name: str) -> tuple[int, float, tuple[int, str] | None]:
        key = (iteration, name)
        with self._lock:
            if key not in self._bars:
                owner = self._current if self._current != key else None
                full = f"iteration {iteration} {name}"
                # a part (validate's verification) is indented under its stage; under WIDE the header names the
                # iteration, and the finished line (`_frozen`) gets the full label back
                label = f"  {name}" if owner else full if self.wide else name
                task_id = self.progress.add_task(plain(label).ljust(30 if self.wide else 20), total=None, rate="",
                                                 full=plain(f"  {name}" if owner else full))
                self._bars[key] = (task_id, time.monotonic(), owner)
            return self._bars[key]

    def _end(self, key: tuple[int, str], line: str, ok: bool) -> None:
        """Print the stage's line above the live region (or as a plain line) and drop its bars and its parts'."""
        iteration, name = key
        task_id, start, _ = self._bars[key]
        seconds = time.monotonic() - start
        summary = plain(line.split(": ", 1)[1] if line.startswith(f"{name}: ") else line)
        own = _OWN_RATE.search(summary)
        if own:  # the stage measured its own throughput: the line gives that one, not the bar's as well
            summary = summary[:own.start()] + summary[own.end():]
        if self.mode == LINES:
            self.console.print(Text(f"iteration {iteration} {name}: {summary} ({seconds:.1f} s)"), soft_wrap=True)
        elif self.mode == LIVE:
            task = next(t for t in self.progress.tasks if t.id == task_id)
            total = task.total if task.total is not None else 1
            rate = _tok_s(float(own.group(1))) if own else task.fields.get("tok", "")
            self.progress.update(task_id, total=total, completed=total if ok else task.completed,
                                 mark="[green]✓" if ok else "[red]✗", description=task.fields["full"].ljust(30),
                                 # the last update's loss only where no summary gives the stage's own numbers
                                 rate=" ".join(p for p in ("" if ok else task.fields.get("note", ""), rate) if p))
            self.progress.stop_task(task_id)
            self.console.print(self._frozen(task, summary))
        with self._lock:
            for k in [k for k, (_, _, owner) in self._bars.items() if k == key or owner == key]:
                self.progress.remove_task(self._bars.pop(k)[0])
                self._anchors.pop(k, None)
            self._current = None

    def _frozen(self, task: Task, summary: str) -> Text:
        """A finished stage as one line of text: its bar row as the live region drew it, then its summary
        (wrapping onto whole lines of its own when long)."""
        row = self.console.render_lines(self.progress.make_tasks_table([task]), pad=False)[0]
        line = Text.assemble(*((s.text, s.style) for s in row if not s.control))
        line.rstrip()
        line.append(f"  {summary}")
        return line

    def _header(self) -> Text:
        seconds = int(time.monotonic() - self._start)
        parts = [f"run {self.run_id}" if self.run_id else "sage"]
        if self._current is not None:
            k, name = self._current
            parts += [f"iteration {k}" + (f"/{self.iterations}" if self.iterations else ""), name]
        parts.append(_clock(seconds))
        return Text(" · ".join(plain(p) for p in parts), style="bold")

    def __rich__(self) -> Group:
        return Group(self._header(), self.progress)

    # -- the terminal while it runs

    def __enter__(self) -> Display:
        self._silence_tqdm()
        if self.mode == QUIET:
            self._route_logs(logging.WARNING)
            return self
        self._route_logs(logging.NOTSET if self.verbose else logging.WARNING)
        if self.mode == LIVE:
            self._live = Live(self, console=self.console, refresh_per_second=4, transient=True,
                              vertical_overflow="crop")
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            left = [t for t in self.progress.tasks]  # bars no stage ended (a command that only reports rows)
            if left:
                self.console.print(self.progress.make_tasks_table(left))
            self._live.stop()
            self._live = None
        while self._undo:
            self._undo.pop()()

    def _route_logs(self, level: int) -> None:
        """Swap every logging handler that writes to the terminal for one that prints through this console
        (above the live region), at `level` or the handler's own level, whichever is higher."""
        terminals = {sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__}
        loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
        for logger in loggers:
            for handler in list(logger.handlers):
                if type(handler) is logging.FileHandler or getattr(handler, "stream", None) not in terminals:
                    continue
                ours = _ConsoleHandler(self.console, max(level, handler.level))
                ours.setFormatter(handler.formatter)
                for f in handler.filters:
                    ours.addFilter(f)
                logger.removeHandler(handler)
                logger.addHandler(ours)
                self._undo.append(lambda lg=logger, old=handler, new=ours: (lg.removeHandler(new), lg.addHandler(old)))

    def _silence_tqdm(self) -> None:
        """transformers' progress bars off while this display is up (the env var for a later import and for
        the training subprocess; the switch for an imported transformers)."""
        previous = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        self._undo.append(lambda: os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None) if previous is None
                          else os.environ.__setitem__("HF_HUB_DISABLE_PROGRESS_BARS", previous))
        hub = sys.modules.get("huggingface_hub.utils")
        if hub is not None and not hub.are_progress_bars_disabled():
            hub.disable_progress_bars()
            self._undo.append(hub.enable_progress_bars)
        hf = sys.modules.get("transformers.utils.logging")
        if hf is not None and hf.is_progress_bar_enabled():
            hf.disable_progress_bar()
            self._undo.append(hf.enable_progress_bar)


class _ConsoleHandler(logging.Handler):
    """A log record printed through a rich console: above a live region, control characters escaped."""

    def __init__(self, console: Console, level: int):
        super().__init__(level)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            style = "red" if record.levelno >= logging.ERROR else "yellow" if record.levelno >= logging.WARNING else ""
            self.console.print(Text(plain(self.format(record)), style=style), soft_wrap=True)
        except Exception:
            self.handleError(record)


def _ended(e: BaseException) -> str:
    """How a stage's bar ends when `e` stops it: "interrupted (SIGTERM)" for a signal (its name, not the exception's:
    that is `Interrupted`), else "failed: " and the exception's type."""
    if isinstance(e, KeyboardInterrupt):
        import signal

        signum = getattr(e, "signum", None)
        return f"interrupted ({signal.Signals(signum).name})" if signum else "interrupted"
    return f"failed: {type(e).__name__}"
