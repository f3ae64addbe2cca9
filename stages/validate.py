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
Idempotency key: rollout id (run, iteration, 'validate', question, template) and verdict id = rollout id, so
a re-run generates and verifies only what is missing and recomputes the same numbers.
Fails: when training is on but iteration k has no adapter yet; engine errors propagate; bad answers score 0.
"""

from __future__ import annotations

import dataclasses

from sage.configs.names import Purpose, Stage
from sage.stages.context import StageContext, StageReport
from sage.stages.rollouts import Unit, generate, question_fields
from sage.stages.verify import verify_rollouts
from sage.warehouse.queries import iteration_adapter, stored_path
from sage.warehouse.validate_queries import BASE, record_validation, validation_questions, validation_scores

STAGE = Stage.VALIDATE


def model_of(ctx: StageContext) -> str | None:
    """The adapter iteration `ctx.iteration` ends with (None = the base model)."""
    if ctx.iteration == 0:
        return None
    adapter = iteration_adapter(ctx.wh, ctx.run_id, ctx.iteration)
    if adapter is None and ctx.cfg.train.enabled:
        raise RuntimeError(f"iteration {ctx.iteration} of run {ctx.run_id!r} has no trained adapter yet; run its "
                           f"train stage first (`sage stage train --run {ctx.run_id} --iteration {ctx.iteration}`)")
    return adapter


def _validation_context(ctx: StageContext, adapter: str | None) -> StageContext:
    # Greedy answers as long as validate.max_new_tokens, unset the Solver's own (its constrained regex follows it).
    tokens = ctx.cfg.validate.answer_tokens(ctx.cfg.roles.solver)
    solver = ctx.cfg.roles.solver.model_copy(update={"max_new_tokens": tokens})
    cfg = ctx.cfg.model_copy(update={"roles": ctx.cfg.roles.model_copy(update={"solver": solver})})
    return dataclasses.replace(ctx, cfg=cfg, adapter=adapter)


def run(ctx: StageContext) -> StageReport:
    questions = validation_questions(ctx.wh)
    if not questions:
        return StageReport(STAGE, info={"skipped": "no validation questions (origin 'validation')"})
    adapter = model_of(ctx)
    vctx = _validation_context(ctx, adapter)
    units = [Unit(f"solver_{q['domain']}", q["question_id"], q["domain"], question_fields(q)) for q in questions]
    _, written = generate(vctx, STAGE, Purpose.VALIDATE, units, greedy=True)
    verify_rollouts(vctx, Purpose.VALIDATE, "validate_verify")
    scores = validation_scores(ctx.wh, ctx.run_id, ctx.iteration)
    stored = BASE if adapter is None else stored_path(ctx.wh, adapter)  # relative to the project directory
    with ctx.wh.transaction():
        record_validation(ctx.wh, ctx.run_id, ctx.iteration, stored, scores)
    info = {k: scores[k] for k in ("val_accuracy", "val_math", "val_code", "val_mean_s_gt", "n_math", "n_code")}
    return StageReport(STAGE, rows_in=len(questions), rows_out=written, info={"adapter": stored, **info})
