"""validate: the Solver answers the held-out validation set greedily, scoring a checkpoint for early stopping.

Reads: every `validation` question (a fixed set loaded by `seed`, never in the pool) and the model of
iteration k: the base model for k = 0, else the adapter iteration k trained (`iterations.adapter_out`; the
base model when `train.enabled` is false). Generates one greedy answer per question (temperature 0, pass@1,
no plan, `validate.max_new_tokens`, by default the Solver's own length; purpose `validate`), verifies it with the
verify stage's math checker and sandbox, and writes: the rollouts, their verdicts, and the iteration's
`checkpoints` row's val_accuracy (pass@1: the share of answers with s_gt = 1, so a code answer counts only when
every test passes), val_math and val_code (per domain; NULL for a domain without questions), and val_mean_s_gt (mean
s_gt, partial credit included). val_accuracy decides `is_best` and early stopping. The row is created when
training wrote none (iteration 0, or training off) with adapter_path 'base' or the adapter's path; an existing
row keeps its path and metrics.
With `validate.pipeline` it also validates the Planner -> gate -> Solver pipeline beside it (plain validation still
decides early stopping): the Planner writes a greedy plan for every validation question (purpose `validate_plan`),
the Critic scores it (`validate_critique`), the Solver answers the question shown that plan (`validate_hinted`), and
the checkpoint gets val_plan_shown (pass@1 with every plan shown), val_pipeline (shown only where s_p >= beta, the
plain answer elsewhere, as a deployed pipeline would answer) and val_plans_passed (the gate's pass rate).
Idempotency key: rollout id (run, iteration, 'validate', question, template) and verdict id = rollout id, so
a re-run generates and verifies only what is missing and recomputes the same numbers.
Fails: when training is on but iteration k has no adapter yet; engine errors propagate; bad answers score 0.
"""
# pyright: basic

from __future__ import annotations

import dataclasses

from sage.configs.names import Purpose, Stage
from sage.stages.context import RunContext, StageReport
from sage.stages.prompts import PromptKind
from sage.stages.rollouts import Unit, generate, question_fields
from sage.stages.score import critic_score, gate
from sage.stages.verify import verify_rollouts
from sage.warehouse.queries import iteration_adapter, rollouts_for, stored_path
from sage.warehouse.validate_queries import (
    BASE,
    pipeline_rows,
    record_pipeline,
    record_validation,
    validation_questions,
    validation_scores,
)

STAGE = Stage.VALIDATE


def model_of(ctx: RunContext) -> str | None:
    """The adapter iteration `ctx.iteration` ends with (None = the base model)."""
    if ctx.iteration == 0:
        return None
    adapter = iteration_adapter(ctx.wh, ctx.run_id, ctx.iteration)
    if adapter is None and ctx.cfg.train.enabled:
        raise RuntimeError(f"iteration {ctx.iteration} of run {ctx.run_id!r} has no trained adapter yet; run its "
                           f"train stage first (`sage stage train --run {ctx.run_id} --iteration {ctx.iteration}`)")
    return adapter


def _validation_context(ctx: RunContext, adapter: str | None) -> RunContext:
    # Greedy answers as long as validate.max_new_tokens, unset the Solver's own (its constrained regex follows it).
    tokens = ctx.cfg.validate.answer_tokens(ctx.cfg.roles.solver)
    solver = ctx.cfg.roles.solver.model_copy(update={"max_new_tokens": tokens})
    cfg = ctx.cfg.model_copy(update={"roles": ctx.cfg.roles.model_copy(update={"solver": solver})})
    return dataclasses.replace(ctx, cfg=cfg, adapter=adapter)


def run(ctx: RunContext) -> StageReport:
    questions = validation_questions(ctx.wh)
    if not questions:
        return StageReport(STAGE, info={"skipped": "no validation questions (origin 'validation')"})
    adapter = model_of(ctx)
    vctx = _validation_context(ctx, adapter)
    units = [Unit(PromptKind.solver(q["domain"]), q["question_id"], q["domain"], question_fields(q)) for q in questions]
    _, written = generate(vctx, STAGE, Purpose.VALIDATE, units, greedy=True)
    verify_rollouts(vctx, Purpose.VALIDATE, "validate_verify")
    scores = validation_scores(ctx.wh, ctx.run_id, ctx.iteration)
    stored = BASE if adapter is None else stored_path(ctx.wh, adapter)  # relative to the project directory
    with ctx.wh.transaction():
        record_validation(ctx.wh, ctx.run_id, ctx.iteration, stored, scores)
    info = {k: scores[k] for k in ("val_accuracy", "val_math", "val_code", "val_mean_s_gt", "n_math", "n_code")}
    if ctx.cfg.validate.pipeline:
        pipeline = _pipeline(vctx, questions)
        with ctx.wh.transaction():
            record_pipeline(ctx.wh, ctx.run_id, ctx.iteration, pipeline)
        info.update(pipeline)
    return StageReport(STAGE, rows_in=len(questions), rows_out=written, info={"adapter": stored, **info})


def _pipeline(vctx: RunContext, questions: list[dict]) -> dict:
    """The pipeline validation (module docstring): greedy plans, their critiques and the answers shown them, then
    `pipeline_scores` of the verified answers."""
    qs = {q["question_id"]: q for q in questions}
    plans = [Unit(PromptKind.PLANNER, q["question_id"], q["domain"], question_fields(q)) for q in questions]
    generate(vctx, STAGE, Purpose.VALIDATE_PLAN, plans, greedy=True)
    written = rollouts_for(vctx.wh, vctx.run_id, vctx.iteration, Purpose.VALIDATE_PLAN)
    text = {p["rollout_id"]: p["parsed"].get("plan") or "" for p in written}

    def shown(p: dict, solver: bool) -> Unit:
        """The plan `p` shown to the Critic, or to the Solver."""
        q = qs[p["question_id"]]
        kind = PromptKind.solver(q["domain"], plan=True) if solver else PromptKind.CRITIC_PLAN
        return Unit(kind, q["question_id"], q["domain"], question_fields(q, text[p["rollout_id"]]),
                    plan_id=p["rollout_id"])

    generate(vctx, STAGE, Purpose.VALIDATE_CRITIQUE, [shown(p, solver=False) for p in written], greedy=True)
    generate(vctx, STAGE, Purpose.VALIDATE_HINTED, [shown(p, solver=True) for p in written], greedy=True)
    verify_rollouts(vctx, Purpose.VALIDATE_HINTED, "validate_verify")
    return pipeline_scores(pipeline_rows(vctx.wh, vctx.run_id, vctx.iteration), vctx.cfg.iteration.beta)


def pipeline_outcomes(rows: list[dict], beta: float) -> dict[str, list[bool]]:
    """Per question of `pipeline_rows`: whether its plain answer passed (`plain`), its answer shown the plan
    (`shown`), the gated pipeline's (`pipeline`: the shown answer where the plan's s_p >= beta, the plain one
    elsewhere), and whether the plan passed the gate (`passed`)."""
    passed = [gate(critic_score(r["parsed"]), beta) for r in rows]
    plain = [bool(r["plain_passed"]) for r in rows]
    shown = [bool(r["hinted_passed"]) for r in rows]
    return {"plain": plain, "shown": shown, "pipeline": [s if p else a for a, s, p in zip(plain, shown, passed)],
            "passed": passed}


def pipeline_scores(rows: list[dict], beta: float) -> dict:
    """From `pipeline_rows`: pass@1 with every plan shown, pass@1 of the gated pipeline and the gate's pass rate
    (`pipeline_outcomes`); None without rows."""
    if not rows:
        return {"val_plan_shown": None, "val_pipeline": None, "val_plans_passed": None}
    outcomes = pipeline_outcomes(rows, beta)
    named = {"val_plan_shown": "shown", "val_pipeline": "pipeline", "val_plans_passed": "passed"}
    return {name: sum(outcomes[key]) / len(rows) for name, key in named.items()}
