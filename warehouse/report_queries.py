"""The SELECTs behind `sage report`: one run's rows of each view users read, ordered by iteration, and the
rest of the page: its training curve, evaluations, stage timings, sample generations and stored config.

`SELECT *` on purpose: a column added to a view by a later migration shows up in the report's tables
without touching this file; the plots name the columns they draw.
"""
# pyright: basic

from __future__ import annotations

import json

from sage.warehouse.db import Warehouse
from sage.warehouse.eval_queries import run_evaluations
from sage.warehouse.queries import iteration_samples, run_config, stage_states

REPORT_VIEWS = ("curriculum_drift", "role_rewards", "gate_stats", "validation_curve")


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


def admitted_questions(wh: Warehouse, run_id: str) -> list[dict]:
    """The run's admitted generated questions from `curriculum_audit`, oldest first: what every later iteration
    trains on, with the evidence for its label (the program's result, the probes' modal answer and share)."""
    return wh.rows("""SELECT iteration, family, text, label, label_check, program_result, probe_mode,
                             probe_mode_share, s_q, difficulty, suspect_label
                      FROM curriculum_audit WHERE run_id = ? AND admitted ORDER BY iteration, question_id""",
                   [run_id])


def admission_frontier(wh: Warehouse, run_id: str) -> list[dict]:
    """Each probed generated question's probe pass rate, whether it was admitted, and the run's admission rule and
    band (the `admission_frontier` view)."""
    return wh.rows("SELECT iteration, pass_rate, probes, admitted, admission, band_low, band_high "
                   "FROM admission_frontier WHERE run_id = ? ORDER BY iteration, question_id", [run_id])


def training_curve(wh: Warehouse, run_id: str) -> list[dict]:
    """Every optimizer update of the run in order (the `training_curve` view)."""
    return wh.rows("SELECT * EXCLUDE (created_at) FROM training_curve WHERE run_id = ? ORDER BY global_step",
                   [run_id])


def evaluations(wh: Warehouse, run_id: str) -> list[dict]:
    """The run's `evaluations` rows (`sage eval`), decoding settings as JSON text."""
    return [{**{k: r[k] for k in ("checkpoint", "benchmark", "metric", "value", "n")},
             "decoding": json.dumps(r["decoding"], sort_keys=True), "created_at": r["created_at"]}
            for r in run_evaluations(wh, run_id)]


def stage_timings(wh: Warehouse, run_id: str) -> list[dict]:
    """Each recorded stage of each iteration: status, rows in/out, attempts, seconds, error."""
    return stage_states(wh, run_id)


def latest_samples(wh: Warehouse, run_id: str, per_role: int = 2) -> tuple[int | None, list[dict]]:
    """A few generations per role from the run's last iteration that has any, with that iteration."""
    last = wh.scalar("SELECT max(iteration) FROM rollouts WHERE run_id = ? AND purpose <> 'validate'", [run_id])
    return last, ([] if last is None else iteration_samples(wh, run_id, last, per_role))


def stored_config(wh: Warehouse, run_id: str) -> str | None:
    """The config the run was recorded with (JSON text, as stored)."""
    stored = run_config(wh, run_id)
    return stored[0] if stored else None
