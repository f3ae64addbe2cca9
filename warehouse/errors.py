"""The warehouse's errors, worded for the user: a busy, damaged or unwritable file (`storage_error` turns DuckDB's
and the OS's failures into sentences that say what to do, wherever they surface), and whether a DuckDB error
was really a signal (`is_interrupt`)."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

_LOCK_PID = re.compile(r"\(PID (\d+)\)")


class WarehouseError(RuntimeError):
    """The warehouse file cannot be used as asked; the message says why and what to do."""


class WarehouseBusy(WarehouseError):
    """Another process holds the warehouse file."""


class WarehouseDamaged(WarehouseError):
    """The file is not a readable DuckDB database (truncated, overwritten, corrupted)."""


class WarehouseUnwritable(WarehouseError):
    """The file cannot be written: a full disk, a read-only file system, no permission."""


def busy(path: str | Path | None, pid: int) -> WarehouseBusy:
    who = f"PID {pid}" if pid > 0 else "another process"
    return WarehouseBusy(f"warehouse in use by {who}{f': {path}' if path else ''}. DuckDB allows one writer; wait "
                         f"for that process to finish (or stop it) and try again")


_DAMAGED = ("not a valid duckdb database file", "could not read enough bytes", "corrupt", "checksum")


def storage_error(exc: BaseException, path: str | Path | None = None) -> WarehouseError | None:
    """The sentence-bearing error for a DuckDB or OS failure on the warehouse file, or None when the failure
    is not one of those (a bug, or SQL the user typed). `path` is the file when the caller knows it (opening
    it, where nothing was written yet); None for a failure surfacing later, in the middle of a command."""
    text = str(exc)
    low, first = text.lower(), text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    errno = getattr(exc, "errno", None)
    where = f"the warehouse {path}" if path else "the warehouse"
    if "lock" in low and "conflicting" in low or "could not set lock" in low:
        m = _LOCK_PID.search(text)
        return busy(path, int(m.group(1)) if m else -1)
    if any(k in low for k in _DAMAGED):
        done = ("nothing was changed" if path else
                "the command stopped there, and what it committed before is kept")
        return WarehouseDamaged(f"{where} is damaged ({first}); {done}. Restore it from a copy or from "
                                f"`sage export-parquet` output, or start afresh in another directory "
                                f"(--set run.dir=NEW for `sage run`, --dir NEW for the other commands)")
    if errno == 28 or "no space left on device" in low:
        return WarehouseUnwritable(f"no space left on the disk holding {where}: the batch in flight was not "
                                   f"committed and everything committed before it is intact. Free some space and "
                                   f"run the same command again to resume")
    if errno == 30 or "read-only file system" in low:
        return WarehouseUnwritable(f"cannot write {where}: the file system is read-only. Pick a writable directory "
                                   f"(--set run.dir=DIR or --dir DIR); `sage status` and `sage sql` can still read "
                                   f"this one")
    if errno == 13 or "permission denied" in low:
        return WarehouseUnwritable(f"cannot write {where}: permission denied. Pick a directory you may write "
                                   f"(--set run.dir=DIR or --dir DIR)")
    return None


def is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a signal that arrived while DuckDB ran a statement (DuckDB reports it as its own error)."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, duckdb.Error) and (
        isinstance(exc, duckdb.InterruptException) or "interrupted" in str(exc).lower()))
