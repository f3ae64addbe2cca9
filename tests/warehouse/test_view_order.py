"""Every view the README lists comes back in a stable order (`warehouse/migrations/015_view_order.sql`): rows
written out of order are read in order, and each definition ends with its ORDER BY."""

from __future__ import annotations

import re
from pathlib import Path

from sage.warehouse import Warehouse

README = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")


def listed_views() -> list[str]:
    """The views in the README's table of views (`| `name` | what it shows |`)."""
    table = README.split("| view | what it shows |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", table, re.M)


def test_every_listed_view_ends_with_an_order_by():
    with Warehouse.open(":memory:") as wh:
        rows = wh.rows("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal")
    sql = {r["view_name"]: r["sql"] for r in rows}
    views = listed_views()
    assert len(views) >= 9 and set(views) <= set(sql), views
    unordered = [v for v in views if not re.search(r"\bORDER BY [\w., \"]+;?\s*$", sql[v])]
    assert unordered == []


def test_rows_written_out_of_order_are_read_in_order():
    with Warehouse.open(":memory:") as wh:
        for run, iteration, step in [("r2", 1, 1), ("r1", 2, 2), ("r1", 1, 2), ("r1", 2, 1), ("r1", 1, 1)]:
            wh.execute("INSERT INTO train_steps (run_id, iteration, step, loss, tokens, seconds) "
                       "VALUES (?, ?, ?, 0.5, 10, 1.0)", [run, iteration, step])
        rows = wh.rows("SELECT run_id, iteration, step, global_step FROM training_curve")
    assert [(r["run_id"], r["iteration"], r["step"], r["global_step"]) for r in rows] == [
        ("r1", 1, 1, 1), ("r1", 1, 2, 2), ("r1", 2, 1, 3), ("r1", 2, 2, 4), ("r2", 1, 1, 1)]
