"""How often does SIGKILL of a pipeline leave a sandbox or math worker running? An owner process (a bwrap
sandbox running a job that loops forever, and a math checker: the scenario of
`tests/engines/verify/test_orphans.py`) is killed at a random moment 0-0.6 s after it starts them, N times; a
run counts when any process it started still runs 33 s later (those are then killed). The test kills once, at
one moment; this finds the rare ones.

    .venv/bin/python -m bench.orphans [--runs N] [--seed S] [--backend bwrap]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time

import psutil

# The process whose SIGKILL is under test: it starts a sandbox job that never ends and a math checker's workers.
OWNER = """
import sys, threading, time
from sage.configs.schema import MathCheckConfig, SandboxConfig
from sage.engines.verify.mathcheck import MathChecker
from sage.engines.verify.sandbox import Job, Sandbox
sandbox = Sandbox(SandboxConfig(backend=sys.argv[1], timeout_s=300, cpu_s=300))
checker = MathChecker(MathCheckConfig(timeout_s=300))
forever = Job("def f():\\n    while True: pass", "f", [[]])
threading.Thread(target=lambda: sandbox.execute([forever]), daemon=True).start()
threading.Thread(target=lambda: checker.check_many([("1", "1")] * 4), daemon=True).start()
print("started", flush=True)
time.sleep(600)
"""


def descendants(pid: int, seen: dict[int, psutil.Process]) -> None:
    try:
        for p in psutil.Process(pid).children(recursive=True):
            seen.setdefault(p.pid, p)
    except psutil.Error:
        pass


def running(procs: list[psutil.Process]) -> list[tuple[int, list[str]]]:
    """pid and command line of each process that still runs (not exited, not a zombie), each read inside one
    guard: a watched process can exit or turn zombie between any two reads of it."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append((p.pid, p.cmdline()))
        except psutil.NoSuchProcess:  # ZombieProcess is a NoSuchProcess
            pass
    return out


def one_run(backend: str, kill_after_s: float) -> list[tuple[int, list[str]]]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, backend], stdout=subprocess.PIPE, text=True)
    assert owner.stdout.readline().strip() == "started"
    family: dict[int, psutil.Process] = {}
    end = time.monotonic() + kill_after_s
    while time.monotonic() < end:
        descendants(owner.pid, family)
        time.sleep(0.01)
    descendants(owner.pid, family)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 33
    while (left := running(list(family.values()))) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="bwrap", choices=["bwrap", "unshare", "rlimit"])
    args = ap.parse_args()
    rng = random.Random(args.seed)
    bad = 0
    for i in range(args.runs):
        left = one_run(args.backend, rng.uniform(0, 0.6))
        bad += bool(left)
        if left:
            print(f"run {i}: left running {[(pid, ' '.join(cmd)[:100]) for pid, cmd in left]}", flush=True)
    print(f"{bad} of {args.runs} runs left a process running ({args.backend}, seed {args.seed})")


if __name__ == "__main__":
    main()
