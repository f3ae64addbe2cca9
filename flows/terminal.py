"""What the `sage` commands print: the consoles, tables of rows, and the one way an expected failure ends a
command (a sentence on stderr saying what is wrong and what to do, and a non-zero exit code)."""

from __future__ import annotations

import json
import logging
import sys
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

console = Console()
err = Console(stderr=True)

USAGE, BUSY = 2, 3  # exit codes: bad input or state the user can fix; the warehouse is in use


def fail(message: str, code: int = USAGE) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def print_rows(rows: list[dict], fmt: str = "table", title: str | None = None) -> None:
    if fmt == "json":
        console.print_json(json.dumps(rows, default=str)) if sys.stdout.isatty() else print(json.dumps(rows, default=str))
        return
    if fmt == "csv":
        import csv

        if rows:
            w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        return
    table = Table(title=title, show_lines=False)
    for name in (rows[0] if rows else []):
        table.add_column(str(name), overflow="fold")
    for r in rows:
        table.add_row(*["" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)) for v in r.values()])
    console.print(table)


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
        exc = storage_error(exc, "the warehouse") or exc
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


def quiet_prefect_tracebacks() -> None:
    """Prefect logs a failed flow's traceback; for an expected failure the command prints its sentence instead
    (unless --verbose). Call after Prefect is imported (it configures its handlers then)."""
    if verbose():
        return
    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _HideExpectedTracebacks) for f in handler.filters):
                handler.addFilter(_HideExpectedTracebacks())
