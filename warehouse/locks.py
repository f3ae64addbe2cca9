"""Who may open the warehouse file, and how long to wait for it.

DuckDB lets one process open a file read-write, and while it is open so no other process can open it at all,
not even read-only. So the `sage` process that writes (the writer) opens the file only for the moment it
commits a batch, and readers get in between. Two locks keep that orderly:

- the *writer lock*, an `flock` on `<warehouse>.writer` held for the writer's whole session and holding its
  PID: a second `sage` writer is refused at once ("warehouse in use by PID N") instead of interleaving its
  batches with the first;
- DuckDB's own lock on the file, held only while a connection is open. A process that finds it taken retries
  with backoff: a reader for `READ_WAIT_S` seconds (the writer holds the file for one commit at a time), the
  writer for as long as a reader holds it (it only fails when another *writer* holds the file, a program that
  is not `sage`).
"""
# pyright: basic

from __future__ import annotations

import fcntl
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

READ_WAIT_S = 10.0     # how long a reader waits for the writer to release the file before it gives up
WAIT_NOTE_S = 5.0      # how long the writer waits for a reader before it says so (once)
_FLOCK = "hhqqi4x"     # Linux's struct flock: l_type, l_whence, l_start, l_len, l_pid (and padding)

_writers: dict[str, list[int]] = {}   # lock file -> [fd, holders in this process]
_writers_guard = threading.Lock()


def lock_holder(path: str | Path) -> tuple[str, int] | None:
    """("read" | "write", pid) for the lock another process holds on the DuckDB file, None when none does.
    Only call it when this process has no connection to the file: closing a descriptor drops every POSIX lock
    the process holds on that file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))
    except OSError:
        return None
    finally:
        os.close(fd)
    if kind == fcntl.F_UNLCK:
        return None
    return ("read" if kind == fcntl.F_RDLCK else "write"), pid


def acquire_writer(path: str | Path) -> int | None:
    """Take the writer lock of the warehouse at `path` for this process (re-entrant: counted per holder).
    Returns None when taken, or the PID of the process that holds it."""
    lock = f"{path}.writer"
    with _writers_guard:
        if lock in _writers:
            _writers[lock][1] += 1
            return None
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            return int(text) if text.isdigit() else -1
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _writers[lock] = [fd, 1]
        return None


def release_writer(path: str | Path) -> None:
    """Give back one hold of the writer lock taken by `acquire_writer`; the last one unlocks the file."""
    lock = f"{path}.writer"
    with _writers_guard:
        held = _writers.get(lock)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _writers[lock]
            os.ftruncate(held[0], 0)
            os.close(held[0])  # closing the descriptor releases the flock


def writer_pid(path: str | Path) -> int | None:
    """The PID of the live process that holds the writer lock of the warehouse at `path`, None when none does.
    Read-only: the lock is not tried (a writer starting then would be refused). A writer killed outright leaves
    its PID in the lock file but is gone; a PID taken since by another process does not hold the file open."""
    lock = f"{path}.writer"
    with _writers_guard:
        if lock in _writers:
            return os.getpid()
    try:
        text = Path(lock).read_text("ascii", "replace").strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's live process
    fds = Path(f"/proc/{pid}/fd")
    try:
        target = os.path.realpath(lock)
        return pid if any(os.path.realpath(fd) == target for fd in fds.iterdir()) else None
    except OSError:  # no /proc (macOS), or another user's process: alive is all we can tell
        return pid


def backoff() -> Iterator[float]:
    """Sleep intervals for retrying a busy file: 10 ms doubling up to 200 ms."""
    delay = 0.01
    while True:
        yield delay
        delay = min(delay * 2, 0.2)
