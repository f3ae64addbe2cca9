"""What the `sage` commands print: the consoles, tables of rows, and the one way an expected failure ends a
command (a sentence on stderr saying what is wrong and what to do, and a non-zero exit code)."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()
err = Console(stderr=True)

USAGE, BUSY = 2, 3  # exit codes: bad input or state the user can fix; the warehouse is in use


def fail(message: str, code: int = USAGE) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def cell(value) -> str:
    """A value as a table cell: None empty, floats to 4 significant digits, and every control character
    escaped (`\\n`, `\\x1b`, ...): cells can hold model output, whose escape sequences must not reach the
    terminal and whose newlines would break the table."""
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def plain(text: str) -> str:
    """Text for the terminal with every control character escaped except newlines and tabs: log lines and
    stage summaries can carry model output, whose escape sequences must not reach the terminal."""
    return _CONTROL.sub(lambda m: m.group() if m.group() in "\n\t" else f"\\x{ord(m.group()):02x}", text)


def _fit(natural: list[int], available: int) -> list[int]:
    """Column widths that fit `available` characters: the widest columns are cut down to one common width,
    the largest that fits, and narrower ones keep theirs (as DuckDB's shell does)."""
    if sum(natural) <= available:
        return natural
    low, high = 1, max(natural)
    while low < high:  # the largest cap whose capped widths still fit
        cap = (low + high + 1) // 2
        low, high = (cap, high) if sum(min(n, cap) for n in natural) <= available else (low, cap - 1)
    return [min(n, low) for n in natural]


def print_rows(rows: list[dict], fmt: str = "table", title: str | None = None,
               columns: list[str] | None = None, count: bool = False) -> None:
    """Print rows as a table that fits the terminal (long cells cut with an ellipsis; no markup read from the
    values), CSV (`\\n` line endings) or JSON. `columns` names the columns when there may be no rows, so an
    empty result still shows its header; `count` adds "N rows" under the table, as DuckDB's shell does."""
    names = list(columns) if columns is not None else list(rows[0]) if rows else []
    if fmt == "json":
        console.print_json(json.dumps(rows, default=str)) if sys.stdout.isatty() \
            else print(json.dumps(rows, default=str))
        return
    if fmt == "csv":
        import csv

        if names:
            w = csv.writer(sys.stdout, lineterminator="\n")
            w.writerow(names)
            w.writerows([r[c] for c in names] for r in rows)
        return
    cells = [[cell(r[c]) for c in names] for r in rows]
    natural = [max([len(cell(name)), *(len(row[i]) for row in cells)]) for i, name in enumerate(names)]
    if len(rows) == 1 and len(names) > 2 and sum(natural) + 3 * len(names) + 1 > console.width:
        # One row too wide for the terminal reads better turned on its side (column | value) than cut.
        print_rows([{"column": n, "value": rows[0][n]} for n in names], fmt, title)
        if count:
            console.print("1 row", highlight=False)
        return
    widths = _fit(natural, console.width - 3 * len(names) - 1)  # each column: 2 padding + 1 border
    table = Table(title=title, show_lines=False)
    for name, width in zip(names, widths):
        table.add_column(Text(cell(name)), overflow="ellipsis", no_wrap=True, width=width)
    for row in cells:
        table.add_row(*map(Text, row))
    console.print(table)
    if count:
        console.print(f"{len(rows)} row" + ("" if len(rows) == 1 else "s"), highlight=False)


def expected_error(exc: BaseException) -> tuple[str, int] | None:
    """(sentence, exit code) for a failure the user can act on: bad input, a missing run or checkpoint, a busy,
    damaged or unwritable warehouse, an unreadable seed or benchmark file. None for anything else (a bug),
    which keeps its traceback."""
    import duckdb

    from sage.configs import ConfigError
    from sage.engines.data.benchmarks import BenchmarkUnavailable
    from sage.engines.data.seeds import SeedFileError
    from sage.engines.llm.models import ModelNotFoundError
    from sage.warehouse import WarehouseBusy, WarehouseError, storage_error
    from sage.warehouse.checkpoints import CheckpointNotFound
    from sage.warehouse.runs import IterationNotFound, RunConfigMismatch, RunNotFound

    if isinstance(exc, (duckdb.Error, OSError)) and not isinstance(exc, ModelNotFoundError):
        exc = storage_error(exc) or exc  # the file is not known here
    if isinstance(exc, WarehouseError):
        return str(exc), BUSY if isinstance(exc, WarehouseBusy) else USAGE
    if isinstance(exc, SeedFileError):  # raised before the seeds are written
        return f"{exc}\nnothing was written", USAGE
    if isinstance(exc, (ConfigError, BenchmarkUnavailable, ModelNotFoundError, RunNotFound,
                        RunConfigMismatch, IterationNotFound, CheckpointNotFound)):
        return str(exc), USAGE
    return None


def verbose() -> bool:
    """Whether `sage --verbose` asked for tracebacks."""
    import click

    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().params.get("verbose"))


class _HideExpectedTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and (isinstance(exc, KeyboardInterrupt) or expected_error(exc)):
            record.exc_info, record.exc_text = None, None
        return True


class _HideSignalCrashes(logging.Filter):
    """Once a signal stopped the command, Prefect reports each run it cut short as an error ("Crash detected!
    Execution was aborted by an interrupt signal", or, when the signal landed inside a DuckDB query, "Query
    interrupted" with a traceback); the command says it in one line, so the terminal drops Prefect's errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        from sage.flows.record import Interrupted

        if not record.name.startswith("prefect") or record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        return not (Interrupted.received is not None or "Execution was aborted by an interrupt signal" in text
                    or "Execution was aborted by a termination signal" in text)


def quiet_prefect_tracebacks() -> None:
    """Prefect logs a failed flow's traceback; for an expected failure the command prints its sentence instead
    (unless --verbose), and a stop by a signal is its one line. Only the terminal's handlers (the root logger's)
    drop those crash lines: the Prefect API still gets every record. Call after Prefect is imported (it
    configures its handlers then)."""
    if verbose():
        return
    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _HideExpectedTracebacks) for f in handler.filters):
                handler.addFilter(_HideExpectedTracebacks())
    for handler in logging.getLogger().handlers:  # the console handlers (Prefect's, or the live display's)
        if not any(isinstance(f, _HideSignalCrashes) for f in handler.filters):
            handler.addFilter(_HideSignalCrashes())
