"""Named queries behind validation, early stopping and adapter export (the `checkpoints` table).

A checkpoint row is (run, iteration): iteration 0 is the base model (adapter_path 'base'), iteration k > 0
the adapter iteration k trained (or 'base' again when training is off). Validation fills val_accuracy,
val_math and val_code (greedy pass@1: s_gt = 1) and val_mean_s_gt; `mark_best` keeps exactly one `is_best` row per
validated run.
"""
# pyright: basic

from __future__ import annotations

from sage.warehouse.db import Warehouse

BASE = "base"  # adapter_path of a checkpoint that is the base model itself


def validation_questions(wh: Warehouse) -> list[dict]:
    """Every held-out validation question (shared by all runs of the warehouse), in a stable order."""
    return wh.records("SELECT question_id, domain, text, verifier FROM questions WHERE origin = 'validation' "
                      "ORDER BY question_id")


def count_validation_questions(wh: Warehouse) -> int:
    return wh.scalar("SELECT count(*) FROM questions WHERE origin = 'validation'")


def validation_scores(wh: Warehouse, run_id: str, iteration: int) -> dict:
    """Greedy pass@1 of this iteration's verified validation answers (an answer counts when s_gt = 1: a code
    answer passes every test): overall (`val_accuracy`), math, code (None where no answer); the mean s_gt
    (partial credit for code) as `val_mean_s_gt`; and how many answers each covers."""
    rows = wh.rows("""
        WITH a AS (
            SELECT q.domain, v.s_gt, CASE WHEN v.s_gt >= 1.0 THEN 1.0 ELSE 0.0 END AS passed
            FROM rollouts r JOIN verdicts v USING (rollout_id) JOIN questions q ON q.question_id = r.question_id
            WHERE r.run_id = ? AND r.iteration = ? AND r.purpose = 'validate')
        SELECT avg(passed)                                  AS val_accuracy,
               avg(passed) FILTER (WHERE domain = 'math')   AS val_math,
               avg(passed) FILTER (WHERE domain = 'code')   AS val_code,
               avg(s_gt)                                    AS val_mean_s_gt,
               count(*)                                     AS n,
               count(*) FILTER (WHERE domain = 'math')      AS n_math,
               count(*) FILTER (WHERE domain = 'code')      AS n_code
        FROM a""", [run_id, iteration])
    return rows[0]


def record_validation(wh: Warehouse, run_id: str, iteration: int, adapter_path: str, scores: dict) -> None:
    """Set the checkpoint's validation numbers; create the row (with `adapter_path`) when training wrote
    none: the baseline at iteration 0, or every iteration when training is off. An existing row keeps its path."""
    wh.execute("""
        INSERT INTO checkpoints (run_id, iteration, adapter_path, val_accuracy, val_math, val_code, val_mean_s_gt)
        VALUES (?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (run_id, iteration) DO UPDATE SET val_accuracy = excluded.val_accuracy,
            val_math = excluded.val_math, val_code = excluded.val_code, val_mean_s_gt = excluded.val_mean_s_gt""",
               [run_id, iteration, adapter_path, scores["val_accuracy"], scores["val_math"], scores["val_code"],
                scores.get("val_mean_s_gt")])


def pipeline_rows(wh: Warehouse, run_id: str, iteration: int) -> list[dict]:
    """Per validation question answered through the pipeline (`validate.pipeline`): whether its plain answer and its
    answer shown the model's own plan passed (s_gt = 1), and the Critic's parsed reply to that plan."""
    return wh.records("""
        WITH plain AS (
            SELECT r.question_id, v.s_gt >= 1.0 AS passed FROM rollouts r JOIN verdicts v USING (rollout_id)
            WHERE r.run_id = $run AND r.iteration = $it AND r.purpose = 'validate'),
        hinted AS (
            SELECT r.question_id, r.plan_id, v.s_gt >= 1.0 AS passed FROM rollouts r JOIN verdicts v USING (rollout_id)
            WHERE r.run_id = $run AND r.iteration = $it AND r.purpose = 'validate_hinted'),
        critique AS (
            SELECT plan_id, parsed FROM rollouts
            WHERE run_id = $run AND iteration = $it AND purpose = 'validate_critique')
        SELECT h.question_id, p.passed AS plain_passed, h.passed AS hinted_passed, c.parsed
        FROM hinted h JOIN plain p USING (question_id) JOIN critique c USING (plan_id)
        ORDER BY h.question_id""", {"run": run_id, "it": iteration})


def record_pipeline(wh: Warehouse, run_id: str, iteration: int, scores: dict) -> None:
    """Set the checkpoint's pipeline validation numbers (its row exists: `record_validation` made it)."""
    wh.execute("UPDATE checkpoints SET val_plan_shown = ?, val_pipeline = ?, val_plans_passed = ? "
               "WHERE run_id = ? AND iteration = ?", [scores["val_plan_shown"], scores["val_pipeline"],
                                                     scores["val_plans_passed"], run_id, iteration])


def validation_history(wh: Warehouse, run_id: str, upto_iteration: int | None = None) -> list[dict]:
    """(iteration, val_accuracy, val_math, val_code, is_best, adapter_path, val_mean_s_gt) of every validated
    checkpoint, in iteration order, optionally only up to `upto_iteration`."""
    return wh.rows("""
        SELECT iteration, val_accuracy, val_math, val_code, is_best, adapter_path, val_mean_s_gt FROM checkpoints
        WHERE run_id = ? AND val_accuracy IS NOT NULL AND iteration <= coalesce(?, iteration)
        ORDER BY iteration""", [run_id, upto_iteration])


def mark_best(wh: Warehouse, run_id: str) -> int | None:
    """Flag the validated checkpoint with the highest val_accuracy (ties: the earliest) as the only best one;
    returns its iteration (None when nothing is validated yet)."""
    with wh.transaction():
        best = wh.scalar("""
            SELECT iteration FROM checkpoints WHERE run_id = ? AND val_accuracy IS NOT NULL
            ORDER BY val_accuracy DESC, iteration ASC LIMIT 1""", [run_id])
        wh.execute("UPDATE checkpoints SET is_best = coalesce(iteration = ?, false) WHERE run_id = ?",
                   [best, run_id])
    return best
