"""The warehouse's errors, worded for the user: a busy, damaged or unwritable file (`storage_error` turns DuckDB's
and the OS's failures into sentences that say what to do, wherever they surface), and whether a DuckDB error
was really a signal (`is_interrupt`)."""
# pyright: basic

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


class WarehouseTooNew(WarehouseError):
    """The file holds migrations this version of the code does not have: a newer version wrote it."""


def too_new(path: str | Path, theirs: int, ours: int) -> WarehouseTooNew:
    return WarehouseTooNew(f"the warehouse {path} has schema version {theirs}, newer than this version of sage "
                           f"knows ({ours}); nothing was changed. Use the sage that wrote it (upgrade this one), or "
                           f"start afresh in another directory (--set run.dir=NEW for `sage run`, --dir NEW for the "
                           f"other commands)")


def not_a_directory(path: str | Path) -> WarehouseError | None:
    """The sentence for a warehouse whose directory cannot be one (a part of it is an existing file), or whose
    file is a directory; None when the path is of the right kinds."""
    path = Path(path)
    if path.is_dir():
        return WarehouseError(f"the warehouse {path} is a directory, not a DuckDB file; move it aside, or pick "
                              f"another project directory (--set run.dir=DIR or --dir DIR)")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return WarehouseError(f"{parent} is a file, not a directory, so the warehouse {path} cannot be made "
                                  f"there; pick a directory (--set run.dir=DIR or --dir DIR)")
        if parent.exists():
            break
    return None


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
    if any(k in low for k in _DAMAGED) and "wal" in low:
        wal = f"{path}.wal" if path else "warehouse.duckdb.wal"
        return WarehouseDamaged(f"the write-ahead log {wal} of {where} is damaged ({first}); nothing was changed. "
                                f"Move it aside (mv {wal} {wal}.damaged): the warehouse then opens with every batch "
                                f"committed before the one in flight when it was damaged (the writer closes the file "
                                f"after each batch, which writes the log into it), and the same command again "
                                f"redoes what is missing")
    if any(k in low for k in _DAMAGED):
        done = ("nothing was changed" if path else
                "the command stopped there, and what it committed before is kept")
        return WarehouseDamaged(f"{where} is damaged ({first}); {done}. Restore it from a copy or from "
                                f"`sage export-parquet` output, or start afresh in another directory "
                                f"(--set run.dir=NEW for `sage run`, --dir NEW for the other commands)")
    if is_full(exc):
        return no_space(path)
    if errno == 27 or "file too large" in low:
        return WarehouseUnwritable(f"cannot write {where}: it reached the file-size limit (ulimit -f); nothing "
                                   f"after the last committed batch was kept. Raise the limit (`ulimit -f "
                                   f"unlimited`) and run the same command again to resume")
    if errno == 30 or "read-only file system" in low:
        return WarehouseUnwritable(f"cannot write {where}: the file system is read-only. Pick a writable directory "
                                   f"(--set run.dir=DIR or --dir DIR); `sage status` and `sage sql` can still read "
                                   f"this one")
    if errno == 13 or "permission denied" in low:
        return WarehouseUnwritable(f"cannot write {where}: permission denied. Pick a directory you may write "
                                   f"(--set run.dir=DIR or --dir DIR)")
    return None


def is_full(exc: BaseException) -> bool:
    """Whether `exc` is a full disk (the OS's ENOSPC, or DuckDB's words for it)."""
    return getattr(exc, "errno", None) == 28 or "no space left on device" in str(exc).lower()


def no_space(path: str | Path | None, need: int | None = None, copy: Path | None = None) -> WarehouseUnwritable:
    """The sentence for a full disk: which file, how much is free there, and how much to free. `need` is what the
    step that failed was writing when the caller knows it; else the file's own size plus its write-ahead log,
    which the next checkpoint and the read-only copy (`run.snapshot`) can each take again. `copy`: the failed
    step was writing that read-only copy (removed again), not the warehouse."""
    import shutil

    where = f"the warehouse {path}" if path else "the warehouse"
    room = ""
    if path:
        p = Path(path)
        if need is None:
            need = sum(f.stat().st_size for f in (p, p.with_name(p.name + ".wal")) if f.is_file())
        try:
            room = f" ({_mb(shutil.disk_usage(p.parent).free)} free there)"
        except OSError:
            pass
        room += f"; free at least {_mb(need)}"
    if copy is not None:
        return WarehouseUnwritable(f"no space left for {copy}, the read-only copy of {where}{room}. The part "
                                   f"copy was removed and the warehouse is intact; free some space, or turn the "
                                   f"copy off with --set run.snapshot=false")
    return WarehouseUnwritable(f"no space left on the disk holding {where}{room}. The batch in flight was not "
                               f"committed and everything committed before it is intact; free some space and run "
                               f"the same command again to resume")


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a signal that arrived while DuckDB ran a statement (DuckDB reports it as its own error)."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, duckdb.Error) and (
        isinstance(exc, duckdb.InterruptException) or "interrupted" in str(exc).lower()))
