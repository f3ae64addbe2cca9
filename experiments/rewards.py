"""What the reward and admission code did in one run: admission and rejection reasons per iteration, the
Challenger's reward of admitted vs rejected questions (admitted must earn more), and validation per checkpoint
(greedy pass@1, a code answer counting only when every test passes, and mean s_gt).

    .venv/bin/python -m experiments.rewards DIR     # DIR: the run directory (holding warehouse.duckdb)
"""

from __future__ import annotations

import argparse
from pathlib import Path

QUERIES = {
    "admission": """
        SELECT iteration, coalesce(rejection_reason, 'admitted') AS outcome, count(*) AS questions
        FROM questions WHERE origin = 'generated' AND admitted IS NOT NULL
        GROUP BY ALL ORDER BY iteration, questions DESC""",
    "Challenger reward, admitted vs rejected": """
        SELECT q.admitted, count(*) AS questions, round(avg(s.reward), 3) AS mean_reward,
               round(max(s.reward), 3) AS max_reward, round(max(s.advantage), 3) AS max_advantage
        FROM questions q JOIN scores s ON s.rollout_id = q.rollout_id
        WHERE q.origin = 'generated' AND q.admitted IS NOT NULL GROUP BY ALL ORDER BY 1""",
    "validation per checkpoint": """
        SELECT r.iteration, count(*) AS problems,
               round(avg(CASE WHEN v.s_gt >= 1 THEN 1.0 ELSE 0.0 END), 3) AS pass_at_1,
               round(avg(v.s_gt), 3) AS mean_s_gt
        FROM rollouts r JOIN verdicts v USING (rollout_id) WHERE r.purpose = 'validate' GROUP BY 1 ORDER BY 1""",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    args = ap.parse_args()
    from sage.flows.terminal import print_rows
    from sage.warehouse import Warehouse

    with Warehouse.open(args.directory / "warehouse.duckdb", read_only=True) as wh:
        for title, sql in QUERIES.items():
            print_rows(wh.rows(sql), title=title)


if __name__ == "__main__":
    main()
