"""Race-free reads of processes a test watches exit.

A watched process can exit or turn zombie between any two reads of it, so each process is read inside one guard:
`running(procs)` lists (pid, command line) of those still running and skips the rest.
"""

from __future__ import annotations

import psutil


def running(procs: list[psutil.Process]) -> list[tuple[int, list[str]]]:
    """pid and command line of each process that still runs (not exited, not a zombie)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append((p.pid, p.cmdline()))
        except psutil.NoSuchProcess:  # ZombieProcess is a NoSuchProcess
            pass
    return out
