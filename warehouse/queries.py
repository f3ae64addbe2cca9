"""Named queries used by the stages and the CLI. Each is small and says what it returns."""

from __future__ import annotations

import pyarrow as pa

from warehouse.db import Warehouse


def existing_ids(wh: Warehouse, table: str, id_column: str, ids: list[str]) -> set[str]:
    """Which of `ids` are already stored in `table`."""
    if not ids:
        return set()
    wh.con.register("_ids", pa.table({"id": ids}))
    try:
        return {r for (r,) in wh.con.execute(f"SELECT {id_column} FROM {table} WHERE {id_column} IN "
                                             f"(SELECT id FROM _ids)").fetchall()}
    finally:
        wh.con.unregister("_ids")


def question_counts(wh: Warehouse) -> list[dict]:
    return wh.rows("SELECT origin, domain, count(*) AS n FROM questions GROUP BY ALL ORDER BY ALL")


def runs_overview(wh: Warehouse) -> list[dict]:
    return wh.rows("""
        SELECT r.run_id, r.status, r.base_model, r.created_at, r.finished_at,
               count(DISTINCT i.iteration) AS iterations
        FROM runs r LEFT JOIN iterations i USING (run_id)
        GROUP BY ALL ORDER BY r.created_at""")


def stage_states(wh: Warehouse, run_id: str) -> list[dict]:
    return wh.rows("""
        SELECT iteration, stage, status, rows_in, rows_out, attempts, round(seconds, 2) AS seconds, error
        FROM stage_runs WHERE run_id = ? ORDER BY iteration, started_at""", [run_id])


# -- stage_runs: what makes "skip what is done, re-run the failed stage" possible ------------------------

def stage_status(wh: Warehouse, run_id: str, iteration: int, stage: str) -> str | None:
    return wh.scalar("SELECT status FROM stage_runs WHERE run_id = ? AND iteration = ? AND stage = ?",
                     [run_id, iteration, stage])


def mark_stage_running(wh: Warehouse, run_id: str, iteration: int, stage: str) -> None:
    wh.con.execute("""
        INSERT INTO stage_runs (run_id, iteration, stage, status) VALUES (?, ?, ?, 'running')
        ON CONFLICT DO UPDATE SET status = 'running', attempts = stage_runs.attempts + 1, error = NULL,
            started_at = now(), finished_at = NULL""", [run_id, iteration, stage])


def mark_stage_finished(wh: Warehouse, run_id: str, iteration: int, stage: str, status: str,
                        rows_in: int | None, rows_out: int | None, seconds: float, error: str | None) -> None:
    wh.con.execute("""
        UPDATE stage_runs SET status = ?, rows_in = ?, rows_out = ?, seconds = ?, error = ?,
            finished_at = now()
        WHERE run_id = ? AND iteration = ? AND stage = ?""",
                   [status, rows_in, rows_out, seconds, error, run_id, iteration, stage])
