"""Named queries used by the stages and the CLI. Each is small and says what it returns.

Rows come back as dicts with their JSON columns (`verifier`, `parsed`, ...) already decoded, `{}` where
nothing usable is stored (`Warehouse.records`).
"""
# pyright: basic

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path

from sage.configs.names import TRAINED_PURPOSES, Purpose, Stage
from sage.warehouse.db import Warehouse


def _rows_with_ids(wh: Warehouse, sql: str, ids: list[str]) -> list[dict]:
    """Run `sql`, which reads the given ids from a table named `_ids` (column `id`)."""
    import pyarrow as pa

    with wh.held() as con:
        con.register("_ids", pa.table({"id": list(dict.fromkeys(ids))}))
        try:
            return wh.records(sql)
        finally:
            con.unregister("_ids")


def existing_ids(wh: Warehouse, table: str, id_column: str, ids: list[str]) -> set[str]:
    """Which of `ids` are already stored in `table`."""
    if not ids:
        return set()
    rows = _rows_with_ids(wh, f"SELECT {id_column} AS id FROM {table} WHERE {id_column} IN (SELECT id FROM _ids)", ids)
    return {r["id"] for r in rows}


def question_counts(wh: Warehouse) -> list[dict]:
    return wh.rows("SELECT origin, domain, count(*) AS n FROM questions GROUP BY ALL ORDER BY ALL")


def runs_overview(wh: Warehouse) -> list[dict]:
    return wh.rows("""
        SELECT r.run_id, r.status, r.base_model, r.created_at, r.finished_at,
               count(DISTINCT i.iteration) AS iterations
        FROM runs r LEFT JOIN iterations i USING (run_id)
        GROUP BY ALL ORDER BY r.created_at""")


def stage_states(wh: Warehouse, run_id: str) -> list[dict]:
    """Each recorded stage of the run, by iteration and then in the order the stages run (`Stage`), whenever
    each was last started: a stage redone later still lists in its place."""
    return wh.rows("""
        SELECT iteration, stage, status, rows_in, rows_out, attempts, round(seconds, 2) AS seconds, error
        FROM stage_runs WHERE run_id = ?
        ORDER BY iteration, list_position(?::VARCHAR[], stage), started_at""", [run_id, [str(s) for s in Stage]])


# -- stage_runs: what makes "skip what is done, re-run the failed stage" possible ------------------------

def stage_status(wh: Warehouse, run_id: str, iteration: int, stage: str) -> str | None:
    return wh.scalar("SELECT status FROM stage_runs WHERE run_id = ? AND iteration = ? AND stage = ?",
                     [run_id, iteration, stage])


def iteration_stage_states(wh: Warehouse, run_id: str, iteration: int) -> dict[str, str]:
    """{stage: status} of the stages recorded for (run, iteration)."""
    return dict(wh.execute("SELECT stage, status FROM stage_runs WHERE run_id = ? AND iteration = ?",
                           [run_id, iteration]))


def owner() -> list:
    """[PID, host] of this process: who a row set `running` belongs to (`running_owners`, `sage status`)."""
    return [os.getpid(), socket.gethostname()]


def running_owners(wh: Warehouse) -> dict[tuple[str, int | None, str | None], tuple[int | None, str | None]]:
    """{(run_id, iteration, stage): (owner PID, owner host)} of every row recorded `running`: a run's key has
    iteration and stage None, an iteration's stage None. Rows older than the owner columns have (None, None)."""
    return {(r, i, s): (pid, host) for r, i, s, pid, host in wh.execute("""
        SELECT run_id, NULL, NULL, owner_pid, owner_host FROM runs WHERE status = 'running'
        UNION ALL SELECT run_id, iteration, NULL, owner_pid, owner_host FROM iterations WHERE status = 'running'
        UNION ALL SELECT run_id, iteration, stage, owner_pid, owner_host FROM stage_runs WHERE status = 'running'
        """)}


def mark_stage_running(wh: Warehouse, run_id: str, iteration: int, stage: str) -> None:
    wh.execute("""
        INSERT INTO stage_runs (run_id, iteration, stage, status, owner_pid, owner_host)
        VALUES (?, ?, ?, 'running', ?, ?)
        ON CONFLICT DO UPDATE SET status = 'running', attempts = stage_runs.attempts + 1, error = NULL,
            started_at = now(), finished_at = NULL, owner_pid = excluded.owner_pid,
            owner_host = excluded.owner_host""", [run_id, iteration, stage, *owner()])


def mark_stage_finished(wh: Warehouse, run_id: str, iteration: int, stage: str, status: str,
                        rows_in: int | None, rows_out: int | None, seconds: float, error: str | None) -> None:
    wh.execute("""
        UPDATE stage_runs SET status = ?, rows_in = ?, rows_out = ?, seconds = ?, error = ?,
            finished_at = now()
        WHERE run_id = ? AND iteration = ? AND stage = ?""",
               [status, rows_in, rows_out, seconds, error, run_id, iteration, stage])


# -- generic update ----------------------------------------------------------------------------------------

def update_rows(wh: Warehouse, table: str, key: str, rows: list[dict]) -> None:
    """Set the given columns of `table` for each row (matched on `key`), in one statement."""
    if not rows:
        return
    columns = [c for c in rows[0] if c != key]
    schema = wh._arrow_schema(table, [key, *columns])
    import pyarrow as pa

    data = pa.Table.from_pylist([{c: r.get(c) for c in [key, *columns]} for r in rows], schema=schema)
    sets = ", ".join(f"{c} = u.{c}" for c in columns)
    with wh.held() as con:
        con.register("_upd", data)
        try:
            con.execute(f"UPDATE {table} SET {sets} FROM _upd u WHERE {table}.{key} = u.{key}")
        finally:
            con.unregister("_upd")


# -- the pool and the iteration's questions ------------------------------------------------------------------

def sample_pool(wh: Warehouse, run_id: str, upto_iteration: int, domains: Sequence[str], k: int, key: str,
                generated: int = 0) -> list[dict]:
    """`k` questions of the pool (seeds plus this run's questions admitted at or before `upto_iteration`) drawn
    uniformly without replacement: the pool ordered by md5(key, question id), a random order that `key` fixes,
    so a re-run draws the same ones. Only the drawn rows leave DuckDB, so the cost does not grow with the pool.
    With `generated` (`iteration.generated_share`), that many of the `k` come first from the run's admitted
    questions, the most recently admitted first (ties in the same random order), or all of them when fewer are
    admitted; the rest are drawn as above from the pool left."""
    pool = """
        SELECT question_id, origin, admitted_iteration FROM questions
        WHERE domain IN (SELECT unnest(?::VARCHAR[]))
          AND (origin = 'seed' OR (origin = 'generated' AND run_id = ? AND admitted AND admitted_iteration <= ?))"""
    args = [domains, run_id, upto_iteration]
    new = [i for (i,) in wh.execute(f"""
        SELECT question_id FROM ({pool}) WHERE origin = 'generated'
        ORDER BY admitted_iteration DESC, md5(? || question_id), question_id LIMIT ?""",
                                    [*args, key, min(generated, k)])] if generated else []
    ids = new + [i for (i,) in wh.execute(f"""
        SELECT question_id FROM ({pool}) WHERE NOT list_contains(?::VARCHAR[], question_id)
        ORDER BY md5(? || question_id), question_id LIMIT ?""", [*args, new, key, k - len(new)])]
    drawn = questions_by_id(wh, ids)
    return [drawn[i] for i in ids]


def pool_norm_hashes(wh: Warehouse, run_id: str) -> set[str]:
    return {h for (h,) in wh.execute("""
        SELECT norm_hash FROM questions
        WHERE origin = 'seed' OR (origin = 'generated' AND run_id = ? AND admitted)""", [run_id])}


def pool_texts(wh: Warehouse, run_id: str) -> list[dict]:
    """(question_id, origin, domain, text, norm_hash, content_key, structure) of the run's pool (seeds plus
    admitted), in a stable order."""
    return wh.rows("""
        SELECT question_id, origin, domain, text, norm_hash, content_key, structure FROM questions
        WHERE origin = 'seed' OR (origin = 'generated' AND run_id = ? AND admitted)
        ORDER BY question_id""", [run_id])


def heldout_questions(wh: Warehouse) -> list[dict]:
    """(question_id, origin, domain, text, norm_hash, content_key) of every validation, benchmark and test question:
    text a generated question must not copy."""
    return wh.rows("SELECT question_id, origin, domain, text, norm_hash, content_key FROM questions "
                   "WHERE origin IN ('validation', 'benchmark', 'test') ORDER BY question_id")


def generated_questions(wh: Warehouse, run_id: str, iteration: int) -> list[dict]:
    return wh.records("""
        SELECT question_id, domain, text, verifier, rollout_id, s_q, difficulty, verifier_valid, verifier_error,
               admitted, rejection_reason, norm_hash
        FROM questions WHERE origin = 'generated' AND run_id = ? AND iteration = ? ORDER BY question_id""",
                      [run_id, iteration])


def questions_by_id(wh: Warehouse, ids: list[str]) -> dict[str, dict]:
    if not ids:
        return {}
    rows = _rows_with_ids(wh, "SELECT question_id, origin, domain, text, verifier, source FROM questions "
                              "WHERE question_id IN (SELECT id FROM _ids)", ids)
    return {r["question_id"]: r for r in rows}


def rollouts_for(wh: Warehouse, run_id: str, iteration: int, purpose: Purpose) -> list[dict]:
    return wh.records("""
        SELECT rollout_id, question_id, plan_id, role, sample_index, completion_text, parsed, format_reward,
               format_reason, finish_reason
        FROM rollouts WHERE run_id = ? AND iteration = ? AND purpose = ? ORDER BY rollout_id""",
                      [run_id, iteration, purpose])


def rollout_count(wh: Warehouse, run_id: str, iteration: int, purpose: Purpose) -> int:
    return wh.scalar("SELECT count(*) FROM rollouts WHERE run_id = ? AND iteration = ? AND purpose = ?",
                     [run_id, iteration, purpose])


def unverified_rollouts(wh: Warehouse, run_id: str, iteration: int, purpose: Purpose) -> list[dict]:
    """Solver rollouts of `purpose` without a verdict, with their question's domain and verifier."""
    return wh.records("""
        SELECT r.rollout_id, r.parsed, q.domain, q.verifier
        FROM rollouts r JOIN questions q ON q.question_id = r.question_id
        LEFT JOIN verdicts v ON v.rollout_id = r.rollout_id
        WHERE r.run_id = ? AND r.iteration = ? AND r.purpose = ? AND v.rollout_id IS NULL
        ORDER BY r.rollout_id""", [run_id, iteration, purpose])


def best_plain_answers(wh: Warehouse, run_id: str, iteration: int) -> dict[str, float]:
    """{plan id: the best s_gt of the verified Solver answers to its question shown no plan} this iteration."""
    return dict(wh.execute("""
        SELECT r.plan_id, max(v.s_gt) FROM rollouts r JOIN verdicts v USING (rollout_id)
        WHERE r.run_id = ? AND r.iteration = ? AND r.purpose = 'solve' AND NOT r.plan_shown AND r.plan_id IS NOT NULL
        GROUP BY r.plan_id""", [run_id, iteration]))


def set_difficulty_from_probes(wh: Warehouse, run_id: str, iteration: int) -> None:
    """r_d = 1 - mean s_gt of the question's probe answers."""
    wh.execute("""
        UPDATE questions SET difficulty = p.r_d
        FROM (SELECT r.question_id, 1 - avg(v.s_gt) AS r_d
              FROM rollouts r JOIN verdicts v USING (rollout_id)
              WHERE r.run_id = ? AND r.iteration = ? AND r.purpose = 'probe'
              GROUP BY r.question_id) p
        WHERE questions.question_id = p.question_id""", [run_id, iteration])


def solver_curriculum(wh: Warehouse, run_id: str, iteration: int) -> dict:
    """The iteration's row of the `solver_curriculum` view ({} before any Solver answer): answers, generated_answers,
    generated_share, questions, generated_questions, generated_asked."""
    rows = wh.rows("SELECT * FROM solver_curriculum WHERE run_id = ? AND iteration = ?", [run_id, iteration])
    return rows[0] if rows else {}


def plans_for(wh: Warehouse, run_id: str, iteration: int) -> list[dict]:
    return wh.records("""
        SELECT p.plan_id, p.question_id, p.s_p, p.passed, r.parsed
        FROM plans p JOIN rollouts r ON r.rollout_id = p.plan_id
        WHERE p.run_id = ? AND p.iteration = ? ORDER BY p.plan_id""", [run_id, iteration])


# -- what the score stage needs, one query per role ------------------------------------------------------------

def scoring_inputs(wh: Warehouse, run_id: str, iteration: int) -> list[dict]:
    """Every trainable rollout of the iteration with what its reward needs (NULL where not applicable)."""
    return wh.rows("""
        SELECT r.rollout_id, r.role, r.purpose, q.domain, r.format_reward,
               g.s_q, g.difficulty, g.verifier_valid, g.admitted, g.batch_repetition,  -- challenger: its question
               pl.s_p AS plan_s_p, pl.passed AS plan_passed, -- planner: its own plan; solver: the plan it got
               v.s_gt
        FROM rollouts r
        JOIN questions q ON q.question_id = r.question_id
        LEFT JOIN questions g ON r.purpose = 'challenge' AND g.rollout_id = r.rollout_id
        LEFT JOIN plans pl ON pl.plan_id = CASE WHEN r.purpose = 'plan' THEN r.rollout_id ELSE r.plan_id END
        LEFT JOIN verdicts v ON v.rollout_id = r.rollout_id
        WHERE r.run_id = ? AND r.iteration = ? AND list_contains(?::VARCHAR[], r.purpose)
        ORDER BY r.rollout_id""", [run_id, iteration, sorted(map(str, TRAINED_PURPOSES))])


# -- runs and iterations ---------------------------------------------------------------------------------------

def run_config(wh: Warehouse, run_id: str) -> tuple[str, str] | None:
    """(config JSON, config hash) of a run, or None when there is no such run."""
    rows = wh.execute("SELECT config, config_hash FROM runs WHERE run_id = ?", [run_id])
    return rows[0] if rows else None


def run_ids(wh: Warehouse) -> list[str]:
    return [r[0] for r in wh.execute("SELECT run_id FROM runs ORDER BY created_at")]


def iteration_states(wh: Warehouse, run_id: str) -> dict[int, str]:
    """{iteration: status} of a run's iterations."""
    return dict(wh.execute("SELECT iteration, status FROM iterations WHERE run_id = ? ORDER BY iteration",
                           [run_id]))


def set_run_config(wh: Warehouse, run_id: str, config: str, config_hash: str) -> None:
    """Store a run's config again (only fields outside its identity may differ)."""
    wh.execute("UPDATE runs SET config = ?, config_hash = ? WHERE run_id = ?", [config, config_hash, run_id])


def set_run_status(wh: Warehouse, run_id: str, status: str) -> None:
    """Set a run's status; `running` also records this process as its owner."""
    if status == "running":
        wh.execute("UPDATE runs SET status = 'running', finished_at = NULL, owner_pid = ?, owner_host = ? "
                   "WHERE run_id = ?", [*owner(), run_id])
        return
    wh.execute("UPDATE runs SET status = ?, finished_at = now() WHERE run_id = ?", [status, run_id])


def start_iteration(wh: Warehouse, run_id: str, iteration: int, adapter_in: str | None) -> None:
    wh.execute("""INSERT INTO iterations (run_id, iteration, adapter_in, owner_pid, owner_host) VALUES (?, ?, ?, ?, ?)
                  ON CONFLICT DO UPDATE SET status = 'running', finished_at = NULL, owner_pid = excluded.owner_pid,
                      owner_host = excluded.owner_host""",
               [run_id, iteration, None if adapter_in is None else stored_path(wh, adapter_in), *owner()])


def finish_iteration(wh: Warehouse, run_id: str, iteration: int, status: str) -> None:
    wh.execute("UPDATE iterations SET status = ?, finished_at = now() WHERE run_id = ? AND iteration = ?",
               [status, run_id, iteration])


# -- adapter paths: stored relative to the project directory (the warehouse's folder), so a copied or moved project
# finds its own adapters and never the original's; a path stored absolute (older rows) stays as it is.

def project_dir(wh: Warehouse) -> Path:
    """The project directory of a warehouse: the folder its file is in."""
    return Path(wh.path).expanduser().resolve().parent


def stored_path(wh: Warehouse, path: str | Path) -> str:
    """How an adapter path is stored: relative to the project directory when it is inside it, else absolute."""
    full = Path(path).expanduser().resolve()
    try:
        return full.relative_to(project_dir(wh)).as_posix()
    except ValueError:
        return str(full)


def located_path(wh: Warehouse, stored: str | None) -> str | None:
    """Where a stored adapter path is now: a relative one under the warehouse's project directory."""
    if stored is None or Path(stored).is_absolute():
        return stored
    return str(project_dir(wh) / stored)


def iteration_adapter(wh: Warehouse, run_id: str, iteration: int) -> str | None:
    """The adapter iteration `iteration` produced (its train stage), or None."""
    return located_path(wh, wh.scalar("SELECT adapter_out FROM iterations WHERE run_id = ? AND iteration = ?",
                                      [run_id, iteration]))


def set_iteration_adapter(wh: Warehouse, run_id: str, iteration: int, adapter_out: str) -> None:
    wh.execute("UPDATE iterations SET adapter_out = ? WHERE run_id = ? AND iteration = ?",
               [adapter_out, run_id, iteration])


# -- summaries -------------------------------------------------------------------------------------------------

def iteration_summary(wh: Warehouse, run_id: str, iteration: int) -> dict[str, list[dict]]:
    """The numbers a user wants after an iteration, as small tables (an iteration that did not train, `train.enabled`
    false, has no training table)."""
    p = [run_id, iteration]
    return {
        "questions": wh.rows("""
            SELECT generated, admitted, rejected, rejected_low_quality, rejected_invalid_verifier,
                   rejected_duplicate, rejected_unparseable, rejected_contaminated, rejected_near_duplicate,
                   round(max_near_dup_similarity, 3) AS max_near_dup_similarity, pool_size,
                   round(mean_s_q, 3) AS mean_s_q, round(mean_difficulty, 3) AS mean_difficulty
            FROM curriculum_drift WHERE run_id = ? AND iteration = ?""", p),
        "plans": wh.rows("SELECT plans, passed, withheld, round(mean_s_p, 3) AS mean_s_p FROM gate_stats "
                         "WHERE run_id = ? AND iteration = ?", p),
        "solver": wh.rows("""
            SELECT CASE WHEN pl.passed THEN 'with plan' ELSE 'without plan' END AS solver,
                   count(*) AS answers, round(avg(v.s_gt), 3) AS accuracy
            FROM rollouts r JOIN verdicts v USING (rollout_id)
            LEFT JOIN plans pl ON pl.plan_id = r.plan_id AND pl.run_id = ? AND pl.iteration = ?  -- none: no Planner
            WHERE r.run_id = ? AND r.iteration = ? AND r.purpose = 'solve' AND v.run_id = ? AND v.iteration = ?
            GROUP BY ALL ORDER BY ALL""", p * 3),
        "roles": wh.rows("""
            SELECT role, rollouts, round(mean_reward, 3) AS mean_reward, round(mean_advantage, 3) AS mean_advantage,
                   round(format_rate, 3) AS format_rate
            FROM role_rewards WHERE run_id = ? AND iteration = ? ORDER BY role""", p),
        "training": wh.rows("""
            SELECT CAST(metrics->>'n_rows' AS INTEGER) AS rows, CAST(metrics->>'n_updates' AS INTEGER) AS updates,
                   CAST(metrics->>'tokens' AS BIGINT) AS tokens, round(CAST(metrics->>'loss' AS DOUBLE), 4) AS loss,
                   round(CAST(metrics->>'grad_norm' AS DOUBLE), 4) AS grad_norm,
                   round(CAST(metrics->>'entropy' AS DOUBLE), 3) AS entropy,
                   round(CAST(metrics->>'clip_fraction' AS DOUBLE), 3) AS clip_fraction,
                   round(CAST(metrics->>'seconds' AS DOUBLE), 1) AS seconds,
                   round(CAST(metrics->>'tokens_per_s' AS DOUBLE), 1) AS tokens_per_s
            FROM checkpoints WHERE run_id = ? AND iteration = ? AND metrics IS NOT NULL""", p),
    }


def iteration_samples(wh: Warehouse, run_id: str, iteration: int, per_role: int = 2) -> list[dict]:
    """A few of the iteration's generations per role (the first by rollout id, so the same ones every time):
    purpose, the last 400 characters of the prompt, the completion, format reward, reward and advantage."""
    return wh.rows("""
        SELECT r.role, r.purpose, right(r.prompt_text, 400) AS prompt_tail, r.completion_text, r.format_reward,
               s.reward, s.advantage
        FROM rollouts r LEFT JOIN scores s ON s.rollout_id = r.rollout_id AND s.run_id = ? AND s.iteration = ?
             AND s.reward_version = (SELECT max(reward_version) FROM scores WHERE run_id = ? AND iteration = ?)
        WHERE r.run_id = ? AND r.iteration = ? AND r.purpose <> 'validate'
        QUALIFY row_number() OVER (PARTITION BY r.role ORDER BY r.rollout_id) <= ?
        ORDER BY r.role, r.rollout_id""", [run_id, iteration] * 3 + [per_role])


# -- training ----------------------------------------------------------------------------------------------

def training_rows(wh: Warehouse, run_id: str, iteration: int, reward_version: int,
                  roles: list[str] | None = None) -> list[dict]:
    """Every rollout of the iteration scored under `reward_version` (of `roles` only, when given), with its
    question, token ids, sampling log-probs, whether it was sampled under its role's grammar (NULL: stored before
    that was recorded), whether its prompt showed a plan (Solver rollouts) and TRR++ advantage."""
    return wh.rows("""
        SELECT r.rollout_id, r.role, r.question_id, r.prompt_ids, r.completion_ids, r.logprobs, r.constrained,
               r.plan_shown, s.advantage
        FROM scores s JOIN rollouts r USING (rollout_id)
        WHERE s.run_id = ? AND s.iteration = ? AND s.reward_version = ? AND r.run_id = ? AND r.iteration = ?
          AND (?::VARCHAR[] IS NULL OR list_contains(?::VARCHAR[], r.role))
        ORDER BY r.rollout_id""", [run_id, iteration, reward_version, run_id, iteration, roles, roles])


def record_checkpoint(wh: Warehouse, run_id: str, iteration: int, adapter_path: str, metrics: dict) -> None:
    """The checkpoints row and the iteration's adapter_out, together (the path stored as `stored_path` says)."""
    adapter_path = stored_path(wh, adapter_path)
    with wh.transaction():
        wh.insert("checkpoints", [dict(run_id=run_id, iteration=iteration, adapter_path=adapter_path, metrics=metrics)])
        set_iteration_adapter(wh, run_id, iteration, adapter_path)


#: The columns of a `train_steps` row the trainer reports (besides run_id and iteration).
TRAIN_STEP_COLUMNS = ("step", "role", "loss", "grad_norm", "entropy", "clip_fraction", "learning_rate", "tokens",
                      "seconds")


def record_train_step(wh: Warehouse, run_id: str, iteration: int, step: dict) -> None:
    """One optimizer update's row of `train_steps`, committed on its own (readers see the curve grow)."""
    wh.insert_batch("train_steps", [{"run_id": run_id, "iteration": iteration,
                                     **{c: step.get(c) for c in TRAIN_STEP_COLUMNS}}])


def train_steps_before(wh: Warehouse, run_id: str, iteration: int, role: str | None = None) -> int:
    """The optimizer updates the run recorded before `iteration`: where its `training_curve.global_step` goes on;
    with `role`, those of that role's own adapter (`train.adapters` per_role)."""
    if role is None:
        return wh.scalar("SELECT count(*) FROM train_steps WHERE run_id = ? AND iteration < ?", [run_id, iteration])
    return wh.scalar("SELECT count(*) FROM train_steps WHERE run_id = ? AND iteration < ? AND role = ?",
                     [run_id, iteration, role])


def clear_train_steps(wh: Warehouse, run_id: str, iteration: int) -> None:
    """Drop the iteration's `train_steps` (left by an interrupted training that is about to run again)."""
    wh.execute("DELETE FROM train_steps WHERE run_id = ? AND iteration = ?", [run_id, iteration])


def checkpoint_path(wh: Warehouse, run_id: str, iteration: int) -> str | None:
    return wh.scalar("SELECT adapter_path FROM checkpoints WHERE run_id = ? AND iteration = ?", [run_id, iteration])
