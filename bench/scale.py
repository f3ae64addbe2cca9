"""Fan-out cost: verification throughput through the local runner versus the Ray runner
(`orchestration.runner`), on the same rows, and the per-task overhead of the Ray path.

    .venv/bin/python -m bench.scale [--math 400] [--chunk-size 0] [--ray-cpus N] [--tasks 24]

Rows are shaped as the verify stage reads them: HumanEval canonical solutions (code, every test input in
one sandbox job) and math answer pairs (math-verify). Both runners get the same parallelism: locally the
sandbox runs 2x cores executions and the math checker one worker per core; with Ray, a local instance of
--ray-cpus CPUs runs one task per CPU, each with 2 executions and 1 math worker. Both are warmed first (Ray
workers import the project and build their engines once). Everything runs inside one Prefect flow, as a
stage does. On a machine this small the goal is that Ray costs little, not that it goes faster.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # as flows/ does: an offline tool

from prefect import flow

from sage.configs import load_config
from sage.configs.schema import SandboxConfig
from sage.engines.data.humaneval import expected_outputs, load_humaneval, record_missing_inputs
from sage.engines.verify.sandbox import Sandbox
from sage.flows.session import Session
from sage.stages.context import StageContext
from sage.stages.verify import verdicts


def code_rows() -> list[dict]:
    """HumanEval canonical solutions with the outputs their own reference produced (JSON-able ones only)."""
    tasks = load_humaneval()
    setup = Sandbox(SandboxConfig())
    record_missing_inputs(tasks, setup)
    rows = []
    for t, expected in zip(tasks, expected_outputs(tasks, setup)):
        try:
            verifier = {"entry_point": t["entry_point"], "inputs": t["inputs"], "outputs": expected}
        except (TypeError, ValueError):
            continue
        if expected is not None:
            rows.append({"rollout_id": t["task_id"], "domain": "code", "verifier": verifier,
                         "parsed": {"answer": t["canonical_solution"]}})
    return rows


def math_rows(n: int) -> list[dict]:
    """The pairs bench/verify.py checks: equal fractions in other forms, and near misses."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        pred = rng.choice([f"{a / b:.6f}", f"\\frac{{{2 * a}}}{{{2 * b}}}", f"{a}/{b + 1}", f"{a * b}"])
        rows.append({"rollout_id": f"m{i}", "domain": "math", "parsed": {"answer": f"\\boxed{{{pred}}}"},
                     "verifier": {"answer": f"\\frac{{{a}}}{{{b}}}"}})
    return rows


def timed(ctx: StageContext, rows: list[dict], batch: int | None = None, repeats: int = 2) -> tuple[float, list]:
    """Best wall time of `repeats` passes of `rows` through `ctx.fanout`, and the verdicts of the last."""
    best, out = float("inf"), []
    for _ in range(repeats):
        start = time.perf_counter()
        out = [v for chunk in ctx.fanout.map(verdicts, rows, batch) for v in chunk]
        best = min(best, time.perf_counter() - start)
    return best, out


def tasks(ctx: StageContext, n: int) -> int:
    size = ctx.fanout.rows_per_task(n)
    return -(-n // size)


def same(a: list[dict], b: list[dict]) -> bool:
    return [(v["rollout_id"], v["s_gt"]) for v in a] == [(v["rollout_id"], v["s_gt"]) for v in b]


@flow(name="bench-scale")
def measure(n_math: int, chunk_size: int, ray_cpus: int, n_tasks: int) -> list[tuple[str, str, str, str, str]]:
    ray_set = ["orchestration.runner=ray", f"orchestration.ray_num_cpus={ray_cpus}"]
    session = Session(tempfile.mkdtemp(prefix="bench-scale-"))
    local = session.context_for(load_config("cpu"), "local")
    ray = session.context_for(load_config("cpu", [*ray_set, f"orchestration.chunk_size={chunk_size}"]), "ray")
    # one row per task, on the same Ray instance
    single = session.context_for(load_config("cpu", [*ray_set, "orchestration.chunk_size=1"]), "single")
    try:
        code, maths = code_rows(), math_rows(n_math)
        start = time.perf_counter()
        for ctx in (local, ray):  # warm: pools, Ray workers (imports, engines)
            timed(ctx, code[:4 * ray_cpus] + maths[:4 * ray_cpus], batch=4, repeats=1)
        warm = time.perf_counter() - start
        # trivial chunks: one math row without an answer each (no check runs), so only the path is timed
        empty = [{**m, "parsed": {}} for m in maths[:n_tasks]]
        rows = []
        for name, data, unit in (("HumanEval canonical (exec/s)", code, "exec"),
                                 ("math checks (checks/s)", maths, "check")):
            (t_local, v_local), (t_ray, v_ray) = timed(local, data), timed(ray, data)
            ok = "same verdicts" if same(v_local, v_ray) else "VERDICTS DIFFER"
            rows.append((name, f"{len(data) / t_local:.1f}", f"{len(data) / t_ray:.1f}", f"{t_local / t_ray:.2f}",
                         f"{len(data)} {unit}s, {tasks(ray, len(data))} Ray tasks, {ok}"))
        (t_local, _), (t_ray, _) = timed(local, empty, batch=1), timed(single, empty)
        rows.append(("per-task overhead (ms)", f"{t_local / n_tasks * 1000:.2f}", f"{t_ray / n_tasks * 1000:.0f}",
                     "", f"{n_tasks} one-row chunks, wall / chunks ({ray_cpus} Ray slots)"))
        rows.append(("Ray start + warm-up (s)", "", f"{warm:.1f}", "", "first use: ray.init, worker imports"))
        return rows
    finally:
        session.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", type=int, default=400, help="math checks")
    ap.add_argument("--chunk-size", type=int, default=0, help="orchestration.chunk_size (0 = auto)")
    ap.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 1, help="CPUs of the local Ray instance")
    ap.add_argument("--tasks", type=int, default=24, help="trivial chunks for the per-task overhead")
    args = ap.parse_args()
    rows = measure(args.math, args.chunk_size, args.ray_cpus, args.tasks)
    print(f"cpu_count={os.cpu_count()}  ray_cpus={args.ray_cpus}  python={sys.version.split()[0]}  "
          f"load={os.getloadavg()[0]:.1f}")
    header = ("measure", "local", "ray", "ray/local", "note")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for r in [header, *rows]:
        print(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}  {r[4]}")


if __name__ == "__main__":
    main()
