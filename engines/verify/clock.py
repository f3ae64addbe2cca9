"""A sandbox job's time limit: the CPU time its processes were charged, under a wall-clock ceiling.

A wall-clock limit charges a job for the machine's other load: beside a neighbour's spinning processes, or a
learning run, an honest job that needs 0.6 s of CPU could be killed at a 5 s limit without having had it. So the
limit (`sandbox.timeout_s`) counts the CPU time the kernel charged to the job's processes together (user and
system time of every process of its tree, and of the processes they reaped), and a job that has been charged it
is stopped. A job that sleeps, blocks or is starved is charged little, so a wall-clock ceiling of `WALL_FACTOR`
times the limit still ends it.

The job's processes are its process tree on the host: a one-job sandbox's first process and its descendants, or
a warm slot's (less what the slot's own processes had been charged before the job). Sessions, process groups and
double forks do not take a process out of it: in the sandbox's pid namespace an orphan is re-parented to the
namespace's first process, which is in the tree and is charged for it when it reaps it. The kernel hands a
process's time to nobody only when it is reaped by no one (its parent ignores SIGCHLD); the ceiling ends such a
job. On `rlimit`, which has no pid namespace, a process that leaves the tree is not charged either.

Reading the tree is a pass over /proc (1-5 ms), so the clock looks only when the limit could have been reached: a
job's processes cannot be charged more than the machine's CPUs' worth of time per second, so the first look is
at `limit / CPUs` seconds (a job that ends sooner is never looked at) and each next one when the rest of the
limit could be spent, `POLL_S` apart at least. A job charged its limit is seen within `POLL_S` and a clock tick.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from sage.engines.verify.isolation import TEARDOWN_S

# A job ends at WALL_FACTOR times its limit on the wall clock whatever it was charged: an honest job that needs
# half its limit passes while it gets a sixth of a CPU, and a job that sleeps holds its worker three limits long.
WALL_FACTOR = 3
POLL_S = 0.02  # the shortest time between two looks at a job's tree
CPUS = os.cpu_count() or 1  # CPUs the kernel may run a job's processes on: the fastest it can be charged
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> tuple[int, int] | None:
    """(parent pid, clock ticks charged: user + system time, its own and its reaped children's) of a process, or
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold ")"
        return int(fields[1]), int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    except (OSError, IndexError, ValueError):
        return None


def tree(root: int) -> list[int]:
    """`root` and its descendants now, every parent before its children (breadth first)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(name)) is not None:
            children.setdefault(st[0], []).append(int(name))
    order, seen = [root], {root}
    for pid in order:  # grows while it is walked
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                order.append(child)
    return order


def charged_s(pids: Sequence[int]) -> float:
    """CPU seconds charged to `pids`, a tree as `tree` orders it. Read parents first, a process reaped meanwhile is
    counted once at most: its parent (or the namespace's first process, an ancestor too) was read before its time
    moved there, and the process itself is read after, while it is still a zombie, or not at all."""
    return TICK_S * sum(st[1] for pid in pids if (st := _stat(pid)) is not None)


class JobClock:
    """One job's time limit: `expired` once its processes were charged `limit_s` of CPU or `WALL_FACTOR * limit_s`
    passed on the wall clock since `start`. Until `watch` names its processes only the ceiling counts."""

    def __init__(self, limit_s: float, start: float):
        self.limit_s, self.start = limit_s, start
        self.ceiling = start + WALL_FACTOR * limit_s
        self.used_s = 0.0  # CPU seconds charged at the last look
        self._root: int | None = None
        self._base = 0.0
        self._next = start + limit_s / CPUS  # no job can be charged its limit sooner

    def watch(self, root: int, residents: Sequence[int] = ()) -> None:
        """Charge the job for `root`'s tree from now on, less what `residents` (a warm slot's own processes, which
        outlive each job: `tree` of the slot while idle) had been charged before it."""
        self._root, self._base = root, charged_s(residents)

    def expired(self, now: float) -> bool:
        """Has the job used up its limit (CPU time charged, or the wall-clock ceiling)? When it has, `used_s` is
        what it was charged."""
        if self._root is not None and (now >= self._next or now >= self.ceiling):
            self.used_s = max(0.0, charged_s(tree(self._root)) - self._base)
            if self.used_s >= self.limit_s:
                return True
            self._next = now + max(POLL_S, (self.limit_s - self.used_s) / CPUS)
        return now >= self.ceiling

    def wait_s(self, now: float) -> float:
        """How long a caller may wait before asking `expired` again."""
        until = self.ceiling if self._root is None else min(self.ceiling, self._next)
        return max(0.0, until - now)

    def teardown_by(self) -> float:
        """When the job's teardown must have let the caller go: `TEARDOWN_S` after it was stopped, or after its limit
        on the wall clock for a job that ended sooner (its teardown may take until then, so that a slow one is
        rarely left to the background)."""
        return max(time.monotonic(), self.start + self.limit_s) + TEARDOWN_S
