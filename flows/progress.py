"""Progress on the terminal: one bar per stage, rows done of total and tokens per second."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StageProgress:
    def __init__(self, console: Console | None = None):
        self.progress = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                 console=console or Console(stderr=True), transient=False)
        self._tasks: dict[str, tuple[int, float]] = {}
        self.prefix = ""

    def __enter__(self) -> "StageProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def __call__(self, stage: str, done: int, total: int, tokens: int = 0) -> None:
        key = f"{self.prefix}{stage}"
        if key not in self._tasks:
            self._tasks[key] = (self.progress.add_task(key, total=max(total, 1), rate=""), time.perf_counter())
        task_id, start = self._tasks[key]
        elapsed = max(time.perf_counter() - start, 1e-9)
        rate = f"{tokens / elapsed:,.0f} tok/s" if tokens else ""
        self.progress.update(task_id, completed=done if total else 1, total=max(total, 1), rate=rate)
