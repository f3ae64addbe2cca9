"""The SELECTs behind `sage report`: one run's rows of each view users read, ordered by iteration.

`SELECT *` on purpose: a column added to a view by a later migration shows up in the report's tables
without touching this file; the plots name the columns they draw.
"""

from __future__ import annotations

from sage.warehouse.db import Warehouse

REPORT_VIEWS = ("curriculum_drift", "role_rewards", "gate_stats", "validation_curve")


def run_exists(wh: Warehouse, run_id: str) -> bool:
    return wh.scalar("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]) > 0


def run_summary(wh: Warehouse, run_id: str) -> dict | None:
    rows = wh.rows("SELECT run_id, base_model, seed, status, created_at, finished_at FROM runs WHERE run_id = ?",
                   [run_id])
    return rows[0] if rows else None


def curriculum_drift(wh: Warehouse, run_id: str) -> list[dict]:
    return wh.rows("SELECT * FROM curriculum_drift WHERE run_id = ? ORDER BY iteration", [run_id])


def role_rewards(wh: Warehouse, run_id: str) -> list[dict]:
    return wh.rows("SELECT * FROM role_rewards WHERE run_id = ? ORDER BY iteration, role", [run_id])


def gate_stats(wh: Warehouse, run_id: str) -> list[dict]:
    return wh.rows("SELECT * FROM gate_stats WHERE run_id = ? ORDER BY iteration", [run_id])


def validation_curve(wh: Warehouse, run_id: str) -> list[dict]:
    return wh.rows("SELECT * FROM validation_curve WHERE run_id = ? ORDER BY iteration", [run_id])


def report_tables(wh: Warehouse, run_id: str) -> dict[str, list[dict]]:
    """Every view of REPORT_VIEWS for one run, by view name."""
    return {"curriculum_drift": curriculum_drift(wh, run_id), "role_rewards": role_rewards(wh, run_id),
            "gate_stats": gate_stats(wh, run_id), "validation_curve": validation_curve(wh, run_id)}
