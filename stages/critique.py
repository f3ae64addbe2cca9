"""critique: the Critic scores new questions (s_q) and plans (s_p); the plan gate is decided here.

Questions (`run_questions`, stage and purpose `critique_question`): reads this iteration's generated
questions that have text; writes one Critic rollout each, then `questions.s_q` from its parsed score
(normalised s = (N - 1) / 9; unparseable or out of range gives the neutral 0.5).
Plans (`run_plans`, stage and purpose `critique_plan`): reads this iteration's plans; writes one Critic
rollout each, then a `plans` row: s_p and whether it passed the gate (s_p >= beta: the Solver sees the plan).
Idempotency key: rollout id; `plans.plan_id` = the Planner rollout; s_q is only set where it is NULL.
Each half reads and writes nothing when its role's switch is off (`iteration.challenger`, `iteration.planner`).
Fails: engine errors propagate; model output never fails the stage.
"""
# pyright: basic

from __future__ import annotations

from sage.configs.names import Purpose, Stage
from sage.stages.context import RunContext, StageReport, switched_off
from sage.stages.prompts import PromptKind
from sage.stages.rollouts import Unit, generate, question_fields
from sage.stages.score import critic_score, gate
from sage.warehouse.queries import generated_questions, questions_by_id, rollouts_for, update_rows


def run_questions(ctx: RunContext) -> StageReport:
    stage = Stage.CRITIQUE_QUESTION
    if not ctx.cfg.iteration.challenger:
        return switched_off(stage, "iteration.challenger")
    questions = [q for q in generated_questions(ctx.wh, ctx.run_id, ctx.iteration) if q["text"]]
    units = [Unit(PromptKind.CRITIC_QUESTION, q["question_id"], q["domain"], question_fields(q)) for q in questions]
    _, written = generate(ctx, stage, Purpose.CRITIQUE_QUESTION, units)
    critiques = {r["question_id"]: r
                 for r in rollouts_for(ctx.wh, ctx.run_id, ctx.iteration, Purpose.CRITIQUE_QUESTION)}
    updates = [{"question_id": q["question_id"], "s_q": critic_score(critiques[q["question_id"]]["parsed"])}
               for q in questions if q["s_q"] is None and q["question_id"] in critiques]
    with ctx.wh.transaction():
        update_rows(ctx.wh, "questions", "question_id", updates)
    return StageReport(stage, rows_in=len(questions), rows_out=written, info={"scored": len(updates)})


def run_plans(ctx: RunContext) -> StageReport:
    stage = Stage.CRITIQUE_PLAN
    if not ctx.cfg.iteration.planner:
        return switched_off(stage, "iteration.planner")
    plans = rollouts_for(ctx.wh, ctx.run_id, ctx.iteration, Purpose.PLAN)
    qs = questions_by_id(ctx.wh, [p["question_id"] for p in plans])
    units = [Unit(PromptKind.CRITIC_PLAN, p["question_id"], qs[p["question_id"]]["domain"],
                  question_fields(qs[p["question_id"]], p["parsed"].get("plan") or ""),
                  plan_id=p["rollout_id"]) for p in plans]
    _, written = generate(ctx, stage, Purpose.CRITIQUE_PLAN, units)
    critiques = {r["plan_id"]: r for r in rollouts_for(ctx.wh, ctx.run_id, ctx.iteration, Purpose.CRITIQUE_PLAN)}
    rows = []
    for p in plans:
        s_p = critic_score(critiques[p["rollout_id"]]["parsed"])
        rows.append(dict(plan_id=p["rollout_id"], run_id=ctx.run_id, iteration=ctx.iteration,
                         question_id=p["question_id"], s_p=s_p, passed=gate(s_p, ctx.cfg.iteration.beta)))
    added = ctx.wh.insert_batch("plans", rows)
    return StageReport(stage, rows_in=len(plans), rows_out=written + added,
                       info={"passed": sum(r["passed"] for r in rows), "withheld": sum(not r["passed"] for r in rows)})
