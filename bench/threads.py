"""OpenMP wait policy: loops of small torch operations under torch's default spin-wait, `OMP_WAIT_POLICY=PASSIVE`
(what `import sage` sets unless the user did) and a short spin (`PASSIVE` with GNU OpenMP's `GOMP_SPINCOUNT`, which
overrides the policy's spin), in fresh processes, interleaved, best of N, with the machine's load printed beside
the figures.

    python bench/threads.py [--rounds 5] [--steps 300] [--busy 1] [--spincount 10000]

Two loops: `decode` (float32 matmuls of 8 rows, one token at a time) and `train` (bf16 matmuls of a 24-token
row through a 576 x 1536 projection and a rank-16 LoRA pair, as a training pass on a short row). A passive wait
puts the OpenMP threads to sleep after every parallel region, and waking them costs tens of microseconds, which
a small operation pays each time; a spin-wait keeps them awake but, when anything else runs, takes the core from
the thread that holds the work. `--busy K` starts K busy-looping processes for the duration, the way the
pipeline's own Prefect server, math workers and sandbox children compete with generation.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys

LOOPS = {
    "decode": """
import time, torch
torch.manual_seed(0)
w = [torch.randn(576, 576) for _ in range(30)]
x = torch.randn(8, 576)
def step(x):
    for m in w: x = torch.tanh(x @ m)
    return x
""",
    "train": """
import time, torch
torch.manual_seed(0)
w = [(torch.randn(1536, 576), torch.randn(16, 576), torch.randn(1536, 16)) for _ in range(10)]
w = [tuple(t.to(torch.bfloat16) * 0.05 for t in m) for m in w]
x = torch.randn(24, 576).to(torch.bfloat16)
def step(x):
    for base, a, b in w:
        h = torch.nn.functional.linear(x, base) + torch.nn.functional.linear(torch.nn.functional.linear(x, a), b)
        x = torch.tanh(h[:, :576]) * 2
    return x
""",
}
TIMED = """
for _ in range(20): x = step(x)
t = time.perf_counter()
for _ in range({steps}): x = step(x)
print(time.perf_counter() - t)
"""


def _spin(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _time(loop: str, settings: dict[str, str], steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", LOOPS[loop] + TIMED.format(steps=steps)], env={**env, **settings},
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--busy", type=int, default=1, help="busy-looping processes running meanwhile")
    ap.add_argument("--spincount", type=int, default=10_000, help="GOMP_SPINCOUNT of the short spin")
    a = ap.parse_args()
    policies = {"default (spin)": {}, "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
                f"short spin ({a.spincount})": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(a.spincount)}}
    stop = mp.Event()
    busy = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(a.busy)]
    for p in busy:
        p.start()
    best = {(loop, name): float("inf") for loop in LOOPS for name in policies}
    try:
        for _ in range(a.rounds):
            for loop, name in best:
                best[loop, name] = min(best[loop, name], _time(loop, policies[name], a.steps))
    finally:
        stop.set()
        for p in busy:
            p.join()
    load = os.getloadavg()[0]
    print(f"{a.steps} steps a loop, {a.busy} busy process(es), load {load:.2f} on {os.cpu_count()} cores, best of "
          f"{a.rounds}")
    for loop in LOOPS:
        passive = best[loop, "PASSIVE"]
        for name in policies:
            t = best[loop, name]
            print(f"  {loop:6s} {name:22s} {t * 1000:8.0f} ms  ({passive / t:.2f}x PASSIVE's speed)")


if __name__ == "__main__":
    main()
