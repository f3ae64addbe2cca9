"""plan: the Planner writes a numbered plan for questions sampled from the pool.

Reads: the pool (seeds + questions admitted up to and including this iteration: admission runs first).
Samples `iteration.n_plan` questions with a seed derived from (run seed, iteration); `iteration.generated_share`
of them from the run's admitted questions, the most recent first (`curriculum`), which the report's
`generated_asked` and `generated_drawn` count (fewer drawn than asked: the pool had too few, and filled the rest).
Writes: one Planner rollout per question (purpose `plan`); nothing with `iteration.planner` false (an ablation:
the solve stage then samples the same questions itself).
Idempotency key: rollout id. Fails: engine errors propagate; model output never fails the stage.
"""
# pyright: basic

from __future__ import annotations

import math

from sage.configs.names import Purpose, Stage
from sage.stages.context import RunContext, StageReport, switched_off
from sage.stages.prompts import PromptKind
from sage.stages.rollouts import Unit, generate, question_fields
from sage.warehouse import content_id
from sage.warehouse.queries import sample_pool

STAGE = Stage.PLAN


def curriculum(ctx: RunContext) -> int:
    """How many of the `n_plan` questions `iteration.generated_share` asks of the admitted ones (rounded half up)."""
    return math.floor(ctx.cfg.iteration.generated_share * ctx.cfg.iteration.n_plan + 0.5)


def sample(ctx: RunContext) -> list[dict]:
    """The iteration's `n_plan` pool questions: the ones the Planner plans, or, without it, the Solver answers."""
    return sample_pool(ctx.wh, ctx.run_id, ctx.iteration, ctx.cfg.iteration.domains, ctx.cfg.iteration.n_plan,
                       content_id("plan-sample", ctx.cfg.run.seed, ctx.run_id, ctx.iteration), curriculum(ctx))


def drawn_info(ctx: RunContext, questions: list[dict]) -> dict:
    """The report's curriculum counts (with a `generated_share`): generated questions asked for and drawn."""
    if not ctx.cfg.iteration.generated_share:
        return {}
    return {"generated_asked": curriculum(ctx),
            "generated_drawn": sum(q["origin"] == "generated" for q in questions)}


def run(ctx: RunContext) -> StageReport:
    if not ctx.cfg.iteration.planner:
        return switched_off(STAGE, "iteration.planner")
    questions = sample(ctx)
    units = [Unit(PromptKind.PLANNER, q["question_id"], q["domain"], question_fields(q)) for q in questions]
    _, written = generate(ctx, STAGE, Purpose.PLAN, units)
    return StageReport(STAGE, rows_in=len(questions), rows_out=written, info=drawn_info(ctx, questions))
