"""What the `sage` commands print: the consoles, tables of rows, and the one way an expected failure ends a
command (a sentence on stderr saying what is wrong and what to do, and a non-zero exit code)."""

from __future__ import annotations

import json
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
