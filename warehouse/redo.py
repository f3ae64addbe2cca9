"""Redoing a stage: the rows one stage wrote for one iteration of a run, which `sage stage NAME --force`
replaces, and the stages after it, which become `stale` because their inputs are about to change.

Each stage's outputs are named here once (DESIGN.md's data flow). Removing a rollout removes what hangs off
it (its verdict and score) in the same transaction, so no row is left pointing at nothing. A stale stage is
not `done`: the next `sage run` redoes it the same way, replacing its rows.
"""
# pyright: basic

from __future__ import annotations

from sage.configs.names import ITERATION_STAGES, Purpose, Stage
from sage.warehouse.db import Warehouse

#: The stages of one iteration in the order they run; validation of the iteration's adapter comes last.
ORDER = (*ITERATION_STAGES, Stage.VALIDATE)

_OF_RUN = "run_id = $run AND iteration = $it"
_ROLLOUTS = f"SELECT rollout_id FROM rollouts WHERE {_OF_RUN} AND purpose = '{{}}'"
_GENERATED = f"{_OF_RUN} AND origin = 'generated'"


def _rollouts(purpose: str) -> list[str]:
    """Delete the iteration's rollouts of `purpose` with their verdicts and scores."""
    ids = _ROLLOUTS.format(purpose)
    return [f"DELETE FROM verdicts WHERE rollout_id IN ({ids})", f"DELETE FROM scores WHERE rollout_id IN ({ids})",
            f"DELETE FROM rollouts WHERE {_OF_RUN} AND purpose = '{purpose}'"]


_FORGET: dict[str, list[str]] = {
    Stage.CHALLENGE: [f"DELETE FROM questions WHERE {_GENERATED}", *_rollouts("challenge")],
    Stage.CRITIQUE_QUESTION: [f"UPDATE questions SET s_q = NULL WHERE {_GENERATED}", *_rollouts("critique_question")],
    Stage.PROBE: [f"UPDATE questions SET difficulty = NULL WHERE {_GENERATED}", *_rollouts("probe")],
    Stage.VERIFY_PROBE: [f"UPDATE questions SET difficulty = NULL WHERE {_GENERATED}",
                         f"DELETE FROM verdicts WHERE rollout_id IN ({_ROLLOUTS.format('probe')})"],
    Stage.ADMIT: [f"UPDATE questions SET admitted = NULL, admitted_iteration = NULL, rejection_reason = NULL "
                  f"WHERE {_GENERATED}"],
    Stage.PLAN: [f"DELETE FROM plans WHERE {_OF_RUN}", *_rollouts("plan")],
    Stage.CRITIQUE_PLAN: [f"DELETE FROM plans WHERE {_OF_RUN}", *_rollouts("critique_plan")],
    Stage.SOLVE: _rollouts("solve"),
    Stage.VERIFY: [f"DELETE FROM verdicts WHERE rollout_id IN ({_ROLLOUTS.format('solve')})"],
    Stage.SCORE: [f"DELETE FROM scores WHERE {_OF_RUN}"],
    Stage.TRAIN: [f"DELETE FROM checkpoints WHERE {_OF_RUN}", f"DELETE FROM train_steps WHERE {_OF_RUN}",
                  "UPDATE iterations SET adapter_out = NULL WHERE run_id = $run AND iteration = $it"],
    Stage.VALIDATE: [*_rollouts("validate"), *_rollouts("validate_plan"), *_rollouts("validate_critique"),
                     *_rollouts("validate_hinted"),
                     f"UPDATE checkpoints SET val_accuracy = NULL, val_math = NULL, val_code = NULL, "
                     f"val_plan_shown = NULL, val_pipeline = NULL, val_plans_passed = NULL WHERE {_OF_RUN}"],
}


def forget_outputs(wh: Warehouse, run_id: str, iteration: int, stage: str) -> None:
    """Remove what `stage` wrote for (run, iteration), in one transaction, so running it again writes it anew."""
    with wh.transaction():
        for sql in _FORGET.get(stage, []):
            wh.execute(sql, {"run": run_id, "it": iteration})


def written_before(wh: Warehouse, run_id: str, iteration: int, stage: str) -> int:
    """The rows `stage` holds for (run, iteration) before an attempt starts: what earlier attempts (failed,
    interrupted, killed) committed, which a resumed generation stage does not write again, so its `rows_out`
    (what it wrote) adds them to cover every attempt: its rollouts, and the questions (challenge) or plans
    (critique_plan) its rows_out counts beside them. 0 for a stage that writes no rollouts of its own."""
    if stage not in {str(p) for p in Purpose}:
        return 0
    rows = wh.scalar("SELECT count(*) FROM rollouts WHERE run_id = ? AND iteration = ? AND purpose = ?",
                     [run_id, iteration, stage])
    if stage == Stage.CHALLENGE:  # its rows_out counts the questions it wrote beside its rollouts
        rows += wh.scalar(f"SELECT count(*) FROM questions WHERE {_GENERATED}", {"run": run_id, "it": iteration})
    if stage == Stage.CRITIQUE_PLAN:  # and the plans rows beside the Critic's
        rows += wh.scalar(f"SELECT count(*) FROM plans WHERE {_OF_RUN}", {"run": run_id, "it": iteration})
    return rows


def mark_later_stale(wh: Warehouse, run_id: str, iteration: int, stage: str) -> list[str]:
    """Mark every recorded stage after `stage` in the iteration `stale` (and the iteration with them); returns
    their names in order. Stages never recorded stay unrecorded: the next run does them anyway."""
    if stage not in ORDER:
        return []
    later = [str(s) for s in ORDER[ORDER.index(Stage(stage)) + 1:]]
    rows = wh.rows("SELECT stage FROM stage_runs WHERE run_id = ? AND iteration = ? AND list_contains(?, stage)",
                   [run_id, iteration, later])
    stale = [s for s in later if s in {r["stage"] for r in rows}]
    if stale:
        with wh.transaction():
            wh.execute("UPDATE stage_runs SET status = 'stale' WHERE run_id = ? AND iteration = ? "
                       "AND list_contains(?, stage)", [run_id, iteration, stale])
            wh.execute("UPDATE iterations SET status = 'stale' WHERE run_id = ? AND iteration = ?",
                       [run_id, iteration])
    return stale


def stale_stages(wh: Warehouse, run_id: str, iteration: int) -> list[str]:
    rows = wh.rows("SELECT stage FROM stage_runs WHERE run_id = ? AND iteration = ? AND status = 'stale'",
                   [run_id, iteration])
    found = {r["stage"] for r in rows}
    return [str(s) for s in ORDER if s in found]


def later_iterations(wh: Warehouse, run_id: str, iteration: int) -> list[int]:
    """Iterations after `iteration` that exist: they generated with adapters downstream of it."""
    return [r["iteration"] for r in wh.rows("SELECT iteration FROM iterations WHERE run_id = ? AND iteration > ? "
                                            "ORDER BY iteration", [run_id, iteration])]
