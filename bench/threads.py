"""OpenMP wait policy: a decode-like loop (small matmuls, one token at a time) with torch's default spin-wait
against `OMP_WAIT_POLICY=PASSIVE` (what `import sage` sets unless the user did), in fresh processes, interleaved,
best of N, with the machine's load printed beside the figures (the policy matters when something else runs).

    python bench/threads.py [--rounds 5] [--steps 300] [--busy 1]

`--busy K` starts K busy-looping processes for the duration, the way the pipeline's own Prefect server, math
workers and sandbox children compete with generation.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys

LOOP = """
import time, torch
torch.manual_seed(0)
w = [torch.randn(576, 576) for _ in range(30)]
x = torch.randn(8, 576)
for _ in range(20):
    for m in w: x = torch.tanh(x @ m)
t = time.perf_counter()
for _ in range({steps}):
    for m in w: x = torch.tanh(x @ m)
print(time.perf_counter() - t)
"""


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _time(policy: str | None, steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", LOOP.format(steps=steps)], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--busy", type=int, default=1, help="busy-looping processes running meanwhile")
    a = ap.parse_args()
    stop = mp.Event()
    busy = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(a.busy)]
    for p in busy:
        p.start()
    best = {"default (spin)": float("inf"), "PASSIVE": float("inf")}
    try:
        for _ in range(a.rounds):
            best["default (spin)"] = min(best["default (spin)"], _time(None, a.steps))
            best["PASSIVE"] = min(best["PASSIVE"], _time("PASSIVE", a.steps))
    finally:
        stop.set()
        for p in busy:
            p.join()
    load = os.getloadavg()[0]
    print(f"decode-like loop, {a.steps} steps, {a.busy} busy process(es), load {load:.2f} on {os.cpu_count()} cores")
    for name, t in best.items():
        print(f"  {name:15s} {t * 1000:8.0f} ms")
    print(f"  PASSIVE / default speed: {best['default (spin)'] / best['PASSIVE']:.2f}x")


if __name__ == "__main__":
    main()
