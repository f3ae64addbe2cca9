"""Warehouse write and view speed: our batched idempotent inserts versus a plain pandas append.

    .venv/bin/python -m bench.warehouse [--rows 100000] [--batch 1000] [--view-rows 1000000]
                                        [--grow 10000,100000,1000000]

Prints rows/s for inserting rollout rows in batches through `Warehouse.insert_batch` (content-hash keys,
ON CONFLICT DO NOTHING, one transaction per batch, the file opened and closed around each batch as a run
does, so readers get in between), the same with one connection held throughout, and `INSERT INTO rollouts
SELECT * FROM df` of the same rows from a pandas DataFrame; then, over a warehouse holding `--view-rows`
rollouts (and as many scores), the time of the views and of committing one small batch with and without
opening the file for it; then, for warehouses of each `--grow` size (a run of 1,000 rollouts an iteration),
the time of every per-iteration query the pipeline makes for its last iteration (training rows, the
iteration summary, the pool sample) and of the views a user opens, with the ratio of the largest to the
smallest: per-iteration bookkeeping should stay flat as the warehouse grows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import pandas as pd

from sage.warehouse import Warehouse, content_id


def make_rows(n: int, run_id: str = "bench") -> list[dict]:
    rng = random.Random(0)
    rows = []
    for i in range(n):
        plen, clen = rng.randint(50, 300), rng.randint(20, 400)
        rows.append(dict(rollout_id=content_id(run_id, i), run_id=run_id, iteration=i // 1000, stage="solve",
                         role=("challenger", "planner", "critic", "solver")[i % 4], purpose="solve",
                         question_id=content_id("q", i % 5000), template="solver_math@1",
                         prompt_text="p" * plen, completion_text="c" * clen,
                         prompt_ids=list(range(plen)), completion_ids=list(range(clen)),
                         logprobs=[-0.5] * clen, sample_index=i % 4, seed=i, finish_reason="stop",
                         prompt_tokens=plen, completion_tokens=clen, parsed={"answer": str(i)},
                         format_reward=1.0))
    return rows


def _insert_batches(wh: Warehouse, rows: list[dict], batch: int) -> float:
    t = time.perf_counter()
    for k in range(0, len(rows), batch):
        wh.insert_batch("rollouts", rows[k:k + batch])
    return time.perf_counter() - t


def bench_inserts(rows: list[dict], batch: int, tmp: Path) -> tuple[float, float, float]:
    """rows/s: insert_batch opening the file per batch; the same holding it throughout; plain pandas."""
    with Warehouse.open(tmp / "ours.duckdb") as wh:
        ours = _insert_batches(wh, rows, batch)
        assert wh.count("rollouts") == len(rows)
    with Warehouse.open(tmp / "held.duckdb") as wh, wh.held():
        held = _insert_batches(wh, rows, batch)

    with Warehouse.open(tmp / "plain.duckdb") as plain, plain.held() as con:
        t = time.perf_counter()
        for k in range(0, len(rows), batch):
            df = pd.DataFrame(rows[k:k + batch])
            df["parsed"] = df["parsed"].map(json.dumps)
            con.register("df", df)
            con.execute(f"INSERT INTO rollouts ({', '.join(df.columns)}) SELECT * FROM df")
            con.unregister("df")
        theirs = time.perf_counter() - t
    return len(rows) / ours, len(rows) / held, len(rows) / theirs


def bench_views(n: int, tmp: Path) -> dict[str, float]:
    wh = Warehouse.open(tmp / "views.duckdb")
    wh.execute("INSERT INTO runs VALUES ('r', '{}', 'h', 'm', 0, now(), NULL, 'done')")
    wh.execute("INSERT INTO iterations (run_id, iteration) SELECT 'r', i FROM range(200) t(i)")
    wh.execute("""INSERT INTO questions (question_id, origin, domain, text, verifier, norm_hash, run_id, iteration,
                      s_q, difficulty, admitted, admitted_iteration, rejection_reason)
                      SELECT 'q' || i, CASE WHEN i < 500 THEN 'seed' ELSE 'generated' END,
                             CASE WHEN i % 2 = 0 THEN 'math' ELSE 'code' END, repeat('x', 50 + i % 200), '{}', 'h' || i,
                             'r', i % 200, (i % 10) / 10.0, (i % 7) / 7.0, i % 3 = 0,
                             CASE WHEN i % 3 = 0 THEN i % 200 END,
                             CASE WHEN i % 3 = 1 THEN 'low_quality' WHEN i % 3 = 2 THEN 'duplicate' END
                      FROM range(?) t(i)""", [n // 10])
    wh.execute("""INSERT INTO rollouts (rollout_id, run_id, iteration, stage, role, purpose, question_id, template,
                      prompt_text, completion_text, prompt_ids, completion_ids, sample_index, seed, format_reward)
                      SELECT 'r' || i, 'r', i % 200, 'solve', ['challenger','planner','critic','solver'][1 + i % 4],
                             'solve', 'q' || (i % 1000), 't', 'p', 'c', [1, 2, 3], [4, 5], 0, i, (i % 2)::DOUBLE
                      FROM range(?) t(i)""", [n])
    wh.execute("""INSERT INTO scores (score_id, rollout_id, reward_version, run_id, iteration, role, reward, components,
                                      group_key, advantage)
                      SELECT 's' || i, 'r' || i, 1, 'r', i % 200, ['challenger','planner','critic','solver'][1 + i % 4],
                             (i % 13) / 13.0, '{}', 'g', 0.0 FROM range(?) t(i)""", [n])
    out = {}
    for view in ("curriculum_drift", "role_rewards", "gate_stats"):
        t = time.perf_counter()
        wh.rows(f"SELECT * FROM {view}")
        out[view] = time.perf_counter() - t
    small = make_rows(20 * 16, run_id="small")
    out["commit 16 rows, file opened for the batch"] = _insert_batches(wh, small[:160], 16) / 10
    with wh.held():
        out["commit 16 rows, file held"] = _insert_batches(wh, small[160:], 16) / 10
    wh.close()
    return out


def fill(wh: Warehouse, n: int, per_iteration: int = 1000) -> int:
    """A run of n rollouts, `per_iteration` per iteration (and as many scores, verdicts for the solver's),
    n / 25 questions (a tenth of them seeds), a plan per 10 rollouts; returns the last iteration."""
    iters = max(n // per_iteration, 1)
    n_q = max(n // 25, 1000)
    wh.execute("INSERT INTO runs VALUES ('r', '{}', 'h', 'm', 0, now(), NULL, 'done')")
    wh.execute("INSERT INTO iterations (run_id, iteration) SELECT 'r', i FROM range(1, ? + 1) t(i)", [iters])
    wh.execute("""INSERT INTO questions (question_id, origin, domain, text, verifier, norm_hash, run_id, iteration,
                      s_q, difficulty, admitted, admitted_iteration, rejection_reason, rollout_id)
                      SELECT 'q' || i, CASE WHEN i < ? / 10 THEN 'seed' ELSE 'generated' END,
                             CASE WHEN i % 2 = 0 THEN 'math' ELSE 'code' END,
                             'what is the value of ' || (i % 997) || ' plus ' || (i % 13) || ' times ' || i,
                             '{"answer": "1"}', 'h' || i,
                             CASE WHEN i >= ? / 10 THEN 'r' END, CASE WHEN i >= ? / 10 THEN 1 + i % ? END,
                             (i % 10) / 10.0, (i % 7) / 7.0, i % 3 = 0, CASE WHEN i % 3 = 0 THEN 1 + i % ? END,
                             CASE WHEN i % 3 = 1 THEN 'low_quality' WHEN i % 3 = 2 THEN 'duplicate' END, 'r' || i
                      FROM range(?) t(i)""", [n_q, n_q, n_q, iters, iters, n_q])
    wh.execute("""INSERT INTO rollouts (rollout_id, run_id, iteration, stage, role, purpose, question_id, template,
                      prompt_text, completion_text, prompt_ids, completion_ids, logprobs, sample_index, seed,
                      format_reward, plan_id)
                      SELECT 'r' || i, 'r', 1 + i // ?, 'solve', ['challenger','planner','critic','solver'][1 + i % 4],
                             ['challenge','plan','critique_plan','solve'][1 + i % 4], 'q' || (i % ?), 't',
                             repeat('p', 400), repeat('c', 200), range(300), range(100),
                             list_transform(range(100), lambda x: -0.5),
                             0, i, (i % 2)::DOUBLE, 'pl' || (i // 10)
                      FROM range(?) t(i)""", [per_iteration, n_q, n])
    wh.execute("""INSERT INTO scores (score_id, rollout_id, reward_version, run_id, iteration, role, reward,
                      components, group_key, advantage)
                      SELECT 's' || i, 'r' || i, 2, 'r', 1 + i // ?,
                             ['challenger','planner','critic','solver'][1 + i % 4],
                             (i % 13) / 13.0, '{}', 'g', (i % 5) - 2.0 FROM range(?) t(i)""", [per_iteration, n])
    wh.execute("""INSERT INTO verdicts (rollout_id, run_id, iteration, kind, s_gt)
                      SELECT 'r' || i, 'r', 1 + i // ?, 'math', (i % 2)::DOUBLE FROM range(?) t(i) WHERE i % 4 = 3""",
                   [per_iteration, n])
    wh.execute("""INSERT INTO plans (plan_id, run_id, iteration, question_id, s_p, passed)
                      SELECT 'pl' || i, 'r', 1 + (i * 10) // ?, 'q' || (i % ?), (i % 10) / 10.0, i % 2 = 0
                      FROM range(? // 10) t(i)""", [per_iteration, n_q, n])
    wh.checkpoint()
    return iters


def bookkeeping(wh: Warehouse, it: int, repeats: int = 3) -> dict[str, float]:
    """Seconds (best of `repeats`) of each per-iteration query the pipeline makes, for iteration `it`."""
    from sage.stages.score import REWARD_VERSION
    from sage.warehouse.queries import iteration_summary, sample_pool, training_rows

    calls = {
        "training_rows": lambda: training_rows(wh, "r", it, REWARD_VERSION),
        "iteration_summary": lambda: iteration_summary(wh, "r", it),
        "pool sample (12 of the pool)": lambda: sample_pool(wh, "r", it, ["math", "code"], 12, "seed"),
        "curriculum_novelty (one iteration)": lambda: wh.rows(
            "SELECT * FROM curriculum_novelty WHERE run_id = 'r' AND iteration = ?", [it]),
        "curriculum_drift (whole view)": lambda: wh.rows("SELECT * FROM curriculum_drift"),
        "role_rewards (whole view)": lambda: wh.rows("SELECT * FROM role_rewards"),
    }
    out = {}
    for name, call in calls.items():
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t)
        out[name] = best
    return out


def bench_growth(sizes: list[int], tmp: Path) -> None:
    """Per-iteration bookkeeping as the warehouse grows: each query's time at each size, and its ratio to the
    smallest (flat is 1.0)."""
    results = {}
    for n in sizes:
        wh = Warehouse.open(tmp / f"grow-{n}.duckdb")
        last = fill(wh, n)
        results[n] = bookkeeping(wh, last)
        wh.close()
    first = sizes[0]
    print(f"\nper-iteration bookkeeping (1,000 rollouts an iteration; load {os.getloadavg()[0]:.1f})")
    print(f"{'query':<38}" + "".join(f"{n:>12,}" for n in sizes) + f"{'ratio':>8}")
    for name in results[first]:
        cells = "".join(f"{results[n][name] * 1000:>10.1f}ms" for n in sizes)
        print(f"{name:<38}{cells}{results[sizes[-1]][name] / results[first][name]:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--view-rows", type=int, default=1_000_000)
    ap.add_argument("--grow", default="10000,100000,1000000",
                    help="rollout counts at which to time per-iteration bookkeeping")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = make_rows(args.rows)
        ours, held, plain = bench_inserts(rows, args.batch, tmp)
        print(f"\ninsert {args.rows:,} rollout rows in batches of {args.batch}")
        print(f"{'method':<46}{'rows/s':>12}{'ratio':>8}")
        print(f"{'Warehouse.insert_batch (file opened per batch)':<46}{ours:>12,.0f}{ours / plain:>8.2f}")
        print(f"{'Warehouse.insert_batch (file held throughout)':<46}{held:>12,.0f}{held / plain:>8.2f}")
        print(f"{'plain pandas -> INSERT SELECT':<46}{plain:>12,.0f}{1.0:>8.2f}")
        views = bench_views(args.view_rows, tmp)
        print(f"\nviews over {args.view_rows:,} rollouts + {args.view_rows:,} scores "
              f"+ {args.view_rows // 10:,} questions")
        for name, secs in views.items():
            print(f"{name:<46}{secs * 1000:>10,.1f} ms")
        bench_growth([int(x) for x in args.grow.split(",")], tmp)


if __name__ == "__main__":
    main()
