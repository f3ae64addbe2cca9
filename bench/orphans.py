"""How often does SIGKILL of a pipeline leave a sandbox or math worker running? The owner of
`tests/engines/verify/test_orphans.py` (a bwrap sandbox running a job that loops forever, and a math checker)
is killed at a random moment 0-0.6 s after it starts them, N times; a run counts when any process it started
still runs 33 s later (those are then killed). The test kills once, at one moment; this finds the rare ones.

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

from tests.engines.verify.test_orphans import OWNER
from tests.processes import running


def descendants(pid: int, seen: dict[int, psutil.Process]) -> None:
    try:
        for p in psutil.Process(pid).children(recursive=True):
            seen.setdefault(p.pid, p)
    except psutil.Error:
        pass


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
