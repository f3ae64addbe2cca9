"""Warehouse write and view speed: our batched idempotent inserts versus a plain pandas append.

    .venv/bin/python -m bench.warehouse [--rows 100000] [--batch 1000] [--view-rows 1000000]

Prints rows/s for inserting rollout rows in batches through `Warehouse.insert_batch` (content-hash keys,
ON CONFLICT DO NOTHING, one transaction per batch, the file opened and closed around each batch as a run
does, so readers get in between), the same with one connection held throughout, and `INSERT INTO rollouts
SELECT * FROM df` of the same rows from a pandas DataFrame; then, over a warehouse holding `--view-rows`
rollouts (and as many scores), the time of the views and of committing one small batch with and without
opening the file for it.
"""

from __future__ import annotations

import argparse
import json
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
                             'r', i % 200, (i % 10) / 10.0, (i % 7) / 7.0, i % 3 = 0, CASE WHEN i % 3 = 0 THEN i % 200 END,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--view-rows", type=int, default=1_000_000)
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
        print(f"\nviews over {args.view_rows:,} rollouts + {args.view_rows:,} scores + {args.view_rows // 10:,} questions")
        for name, secs in views.items():
            print(f"{name:<46}{secs * 1000:>10,.1f} ms")


if __name__ == "__main__":
    main()
