"""Named queries behind `sage eval`: the `evaluations` rows (checkpoint names are resolved in checkpoints.py)."""
# pyright: basic

from __future__ import annotations

from sage.warehouse.db import Warehouse
from sage.warehouse.queries import existing_ids


def stored_evaluations(wh: Warehouse, eval_ids: list[str]) -> set[str]:
    """Which of `eval_ids` are already in `evaluations`."""
    return existing_ids(wh, "evaluations", "eval_id", eval_ids)


def insert_evaluations(wh: Warehouse, rows: list[dict]) -> int:
    """Insert evaluation rows in one transaction (ON CONFLICT DO NOTHING); returns rows added."""
    return wh.insert_batch("evaluations", rows)


def evaluations_by_id(wh: Warehouse, eval_ids: list[str]) -> list[dict]:
    """The `evaluations` rows with these ids (`decoding` decoded), oldest first."""
    if not eval_ids:
        return []
    marks = ", ".join("?" for _ in eval_ids)
    return wh.records(f"SELECT eval_id, run_id, checkpoint, benchmark, metric, value, n, decoding, created_at "
                      f"FROM evaluations WHERE eval_id IN ({marks}) ORDER BY created_at, benchmark, metric",
                      list(eval_ids))


def run_evaluations(wh: Warehouse, run_id: str | None) -> list[dict]:
    """Every evaluation of a run (run_id None: evaluations made without a run)."""
    return wh.records("SELECT eval_id, run_id, checkpoint, benchmark, metric, value, n, decoding, created_at "
                      "FROM evaluations WHERE run_id IS NOT DISTINCT FROM ? ORDER BY created_at, benchmark, metric",
                      [run_id])
