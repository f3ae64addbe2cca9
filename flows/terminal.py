"""What the `sage` commands print: the consoles, tables of rows, and the one way an expected failure ends a
command (a sentence on stderr saying what is wrong and what to do, and a non-zero exit code)."""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import NoReturn

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console()
err = Console(stderr=True)

USAGE, BUSY = 2, 3  # exit codes: bad input or state the user can fix; the warehouse is in use


def fail(message: str, code: int = USAGE) -> NoReturn:
    """End the command: `message` (shown as written: no markup read from it) on stderr, and exit `code`."""
    err.print("[bold red]error:[/]", Text(message), highlight=False)
    raise typer.Exit(code)


# C0 and C1 controls, DEL, and the invisible Unicode controls that reorder or hide text (bidirectional
# overrides and isolates, zero-width marks, line and paragraph separators): model output can carry any of them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def cell(value) -> str:
    """A value as a table cell: None empty, floats to 4 significant digits (zero never `-0`), and every control
    character escaped (`\\n`, `\\x1b`, `\\u202e`, ...): cells can hold model output, whose escape sequences must
    not reach the terminal and whose newlines would break the table."""
    if value is None:
        return ""
    if isinstance(value, float) and value == 0:
        value = 0.0  # a mean of tiny negatives rounds to -0.0: shown as 0, not `-0`
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return _CONTROL.sub(lambda m: _escape(m.group()), text)


def plain(text: str) -> str:
    """Text for the terminal with every control character escaped except newlines and tabs: log lines and
    stage summaries can carry model output, whose escape sequences must not reach the terminal."""
    return _CONTROL.sub(lambda m: m.group() if m.group() in "\n\t" else _escape(m.group()), text)


FORMATS = ("table", "line", "csv", "json")
MAX_CELL = 40  # a table cell longer than this is cut with an ellipsis (`--format line` shows it whole)
MIN_CELL = 20  # cells are cut down to this (never below their header) before any column is hidden
MIN_TEXT = 10  # once ids and timestamps are hidden, long text (over MAX_CELL) is cut to this before more columns go
MORE = "--format line or --format csv shows them"  # how to see hidden columns (`sage sql`'s options)
_HASH = re.compile(r"[0-9a-f]{12,}")


def _incidental(name: str, values: list) -> bool:
    """Whether a column is what a narrow table drops first: a long id (`*_id`, or content-hash values) or a
    timestamp. A reader needs the measures and the text; ids and times are for joins and filters."""
    import datetime

    present = [v for v in values if v is not None]
    if any(isinstance(v, (datetime.datetime, datetime.date, datetime.time)) for v in present):
        return True
    if name.lower().endswith("_at"):
        return True
    strings = [v for v in present if isinstance(v, str)]
    if not strings or len(strings) < len(present):
        return False
    return (name.lower() == "id" or name.lower().endswith("_id") and max(map(len, strings)) >= 8
            or all(_HASH.fullmatch(v) for v in strings))


def _numeric(values: list) -> bool:
    """Whether a column holds numbers (right-aligned, as DuckDB's shell does): no bools, at least one value."""
    import decimal

    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool)
                                 for v in present)


def _fit(floor: list[int], want: list[int], available: int) -> list[int]:
    """Column widths between `floor` and `want` that fit `available` characters: the widest columns are cut
    down to one common width, the largest that fits, and narrower ones keep theirs (as DuckDB's shell does)."""
    if sum(want) <= available:
        return want
    low, high = 0, max(want)
    while low < high:  # the largest cap whose capped widths still fit
        cap = (low + high + 1) // 2
        fits = sum(max(f, min(w, cap)) for f, w in zip(floor, want)) <= available
        low, high = (cap, high) if fits else (low, cap - 1)
    return [max(f, min(w, low)) for f, w in zip(floor, want)]


def _layout(headers: list[int], natural: list[int], available: int, max_cell: list[int],
            incidental: list[bool] | None = None, hide: bool = True) -> tuple[list[int], list[int]] | None:
    """(indexes of the columns shown, their widths) for a table `available` characters wide, or None when
    not even the first column shown fits with its header whole (or, unless `hide`, not every column).
    Headers are never cut. To fit, in this order: cells are cut to their column's `max_cell`, then down to
    `MIN_CELL`; `incidental` columns (long ids, timestamps) are hidden, from the right; long text (cells over
    `MAX_CELL`) is cut down to `MIN_TEXT`; and then the columns on the right that still do not fit are hidden,
    so the left ones (the keys a view starts with) and the measures and text after them stay. Each column costs
    its width plus 3 (border and padding), the table 1 more."""
    n = len(headers)
    want = [max(h, min(w, m)) for h, w, m in zip(headers, natural, max_cell)]
    incidental = incidental or [False] * n

    def floor(i: int, least: int) -> int:  # `least` (MIN_TEXT) cuts only long text: short labels stay whole
        return max(headers[i], min(natural[i], least if natural[i] > MAX_CELL else MIN_CELL))

    def cost(cols: list[int], least: int) -> int:
        return sum(floor(i, least) + 3 for i in cols) + 1

    shown, least = list(range(n)), MIN_CELL
    for i in reversed(range(n)):
        if cost(shown, least) <= available:
            break
        if incidental[i] and len(shown) > 1:
            shown.remove(i)
    if cost(shown, least) > available and hide:
        least = MIN_TEXT
        while len(shown) > 1 and cost(shown, least) > available:
            shown.pop()
    if cost(shown, least) > available or (len(shown) < n and not hide):
        return None
    room = available - 3 * len(shown) - 1
    return shown, _fit([floor(i, least) for i in shown], [want[i] for i in shown], room)


def _line_mode(names: list[str], rows: list[dict], title: str | None) -> None:
    """One `column = value` line per column, a blank line between rows, names right-aligned (DuckDB's
    `.mode line`); values whole, control characters escaped, no markup read from them."""
    if title:
        console.print(Text(cell(title)), soft_wrap=True)
    heads = [cell(n) for n in names]
    width = max(map(cell_len, heads), default=0)
    for k, row in enumerate(rows):
        if k or title:
            console.print()
        for head, name in zip(heads, names):
            console.print(Text(" " * (width - cell_len(head)) + f"{head} = {cell(row[name])}"), soft_wrap=True)


def _count(n: int) -> None:
    console.print(f"{n} row" + ("" if n == 1 else "s"), highlight=False)


def print_rows(rows: list[dict], fmt: str = "table", title: str | None = None,
               columns: list[str] | None = None, count: bool = False, more: str = MORE,
               max_cell: int | dict[str, int] = MAX_CELL, hide: bool = True) -> None:
    """Print rows as a table that fits the terminal, one `column = value` line each (`line`), CSV (`\\n` line
    endings) or JSON. The table keeps headers whole, cuts long cells with an ellipsis (no markup read from the
    values) and right-aligns numbers; when the columns do not fit it hides long ids and timestamps first, then
    cuts text shorter, then hides the columns on the right, and a line under the table names what it hid and
    how to see it (`more`); when not even the first column fits, the rows are printed as lines. One row too
    wide is shown on its side (column | value). `columns` names the columns when there may be no rows, so an
    empty result still shows its header; `count` adds "N rows" under the table, as DuckDB's shell does.
    `max_cell` is where a cell is cut when the terminal has room (one width, or one per column name);
    `hide=False` prints lines rather than hide a column."""
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
    if fmt == "line":
        _line_mode(names, rows, title)
        if count:
            console.print()
            _count(len(rows))
        return
    _table(names, rows, title, count, more, max_cell, hide)


def _table(names: list[str], rows: list[dict], title: str | None, count: bool, more: str,
           max_cell: int | dict[str, int] = MAX_CELL, hide: bool = True) -> None:
    heads = [cell(name) for name in names]
    cells = [[cell(r[c]) for c in names] for r in rows]
    headers = [cell_len(h) for h in heads]
    natural = [max([headers[i], *(cell_len(row[i]) for row in cells)]) for i in range(len(names))]
    if len(rows) == 1 and len(names) > 2 and sum(natural) + 3 * len(names) + 1 > console.width:
        # One row too wide for the terminal reads better turned on its side (column | value) than cut.
        _table(["column", "value"], [{"column": n, "value": rows[0][n]} for n in names], title, False, more,
               max_cell=console.width)
        if count:
            _count(1)
        return
    caps = [max_cell.get(n, MAX_CELL) if isinstance(max_cell, dict) else max_cell for n in names]
    incidental = [_incidental(n, [r[n] for r in rows]) for n in names]
    layout = _layout(headers, natural, console.width, caps, incidental, hide) if names else ([], [])
    if layout is None:  # not even the first column fits with its header whole (or, unless hide, every one)
        _line_mode(names, rows, title)
        if count:
            console.print()
            _count(len(rows))
        return
    shown, widths = layout
    table = Table(title=Text(cell(title)) if title else None, show_lines=False)
    for i, width in zip(shown, widths):
        justify = "right" if _numeric([r[names[i]] for r in rows]) else "left"
        table.add_column(Text(heads[i]), overflow="ellipsis", no_wrap=True, width=width, justify=justify)
    for row in cells:
        table.add_row(*(Text(row[i]) for i in shown))
    console.print(table)
    hidden = [heads[i] for i in range(len(names)) if i not in shown]
    if hidden:
        console.print(Text(f"{len(hidden)} of {len(names)} columns hidden: {', '.join(hidden)}; {more}"))
    if count:
        _count(len(rows))


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


def current_context():
    """The running command's click context, or None. Typer 0.29 runs commands on its own bundled copy of click, whose
    context stack `click.get_current_context` never sees; older typers use click itself."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context
    return get_current_context(silent=True)


def verbose() -> bool:
    """Whether `sage --verbose` asked for tracebacks."""
    ctx = current_context()
    return bool(ctx and ctx.find_root().params.get("verbose"))


#: The start of each expected failure's sentence Prefect logged in this process (up to its first quote, which
#: Prefect's reprs escape): the command prints the sentence itself, so the terminal drops Prefect's lines that
#: repeat it ("Task run failed with exception: ...", "Finished in state Failed(...)").
_SAID: set[str] = set()


def _said(exc: BaseException | None) -> bool:
    """Whether `exc` is a signal or an expected failure (remembering its sentence for `_HideSignalCrashes`)."""
    if exc is None:
        return False
    if isinstance(exc, KeyboardInterrupt):
        return True
    known = expected_error(exc)
    if known:
        _SAID.add(re.split("['\"]", str(exc), maxsplit=1)[0][:80])
    return bool(known)


class _HideExpectedTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if _said(record.exc_info[1] if record.exc_info else None):
            record.exc_info, record.exc_text = None, None
        return True


class _HideSignalCrashes(logging.Filter):
    """Once a signal stopped the command, Prefect reports each run it cut short as an error ("Crash detected!
    Execution was aborted by an interrupt signal", or, when the signal landed inside a DuckDB query, "Query
    interrupted" with a traceback); the command says it in one line, so the terminal drops Prefect's errors. So
    it does for an expected failure (a full disk): the command's sentence says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        from sage.flows.record import Interrupted

        if not record.name.startswith("prefect") or record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        expected = _said(record.exc_info[1] if record.exc_info else None) or any(s and s in text for s in _SAID)
        return not (Interrupted.received is not None or "Execution was aborted by an interrupt signal" in text
                    or "Execution was aborted by a termination signal" in text or expected)


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
