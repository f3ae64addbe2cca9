"""solve: the Solver answers questions, for the difficulty probe and for training.

Probe (`run_probe`): reads this iteration's generated questions that could earn the difficulty term
(valid verifier and s_q >= alpha); writes `iteration.n_probe` Solver rollouts each, without a plan
(purpose `probe`; these measure difficulty and are not trained on); nothing with `iteration.challenger` false.
Solve (`run_solve`): reads this iteration's plans; writes `iteration.n_solve` Solver rollouts per plan
(purpose `solve`), shown the plan only when it passed the gate; `rollouts.plan_id` names the plan either way.
With `iteration.planner` false (an ablation) it answers the pool questions the plan stage would have sampled,
each without a plan, the prompt of a withheld plan, and `rollouts.plan_id` is NULL (so s~_p = 0).
Idempotency key: rollout id. Fails: engine errors propagate; model output never fails the stage.
"""

from __future__ import annotations

from sage.configs.names import Purpose, Stage
from sage.stages import plan
from sage.stages.context import StageContext, StageReport, switched_off
from sage.stages.rollouts import Unit, generate, question_fields
from sage.warehouse.queries import generated_questions, plans_for, questions_by_id


def run_probe(ctx: StageContext) -> StageReport:
    if not ctx.cfg.iteration.challenger:
        return switched_off(Stage.PROBE, "iteration.challenger")
    alpha = ctx.cfg.iteration.alpha
    questions = [q for q in generated_questions(ctx.wh, ctx.run_id, ctx.iteration)
                 if q["verifier_valid"] and q["s_q"] is not None and q["s_q"] >= alpha]
    units = [Unit(f"solver_{q['domain']}", q["question_id"], q["domain"], question_fields(q),
                  n=ctx.cfg.iteration.n_probe)
             for q in questions]
    _, written = generate(ctx, Stage.PROBE, Purpose.PROBE, units)
    return StageReport(Stage.PROBE, rows_in=len(questions), rows_out=written)


def _units(ctx: StageContext) -> list[Unit]:
    """One Solver unit per plan, with the plan when it passed the gate; without the Planner, one per sampled pool
    question, without a plan."""
    n = ctx.cfg.iteration.n_solve
    if not ctx.cfg.iteration.planner:
        return [Unit(f"solver_{q['domain']}", q["question_id"], q["domain"], question_fields(q), n=n)
                for q in plan.sample(ctx)]
    plans = plans_for(ctx.wh, ctx.run_id, ctx.iteration)
    qs = questions_by_id(ctx.wh, [p["question_id"] for p in plans])
    units = []
    for p in plans:
        q = qs[p["question_id"]]
        if p["passed"]:
            plan_text = p["parsed"].get("plan") or ""
            kind, fields = f"solver_{q['domain']}_plan", question_fields(q, plan_text)
        else:
            kind, fields = f"solver_{q['domain']}", question_fields(q)
        units.append(Unit(kind, q["question_id"], q["domain"], fields, n=n, plan_id=p["plan_id"]))
    return units


def run_solve(ctx: StageContext) -> StageReport:
    units = _units(ctx)
    _, written = generate(ctx, Stage.SOLVE, Purpose.SOLVE, units)
    return StageReport(Stage.SOLVE, rows_in=len(units), rows_out=written,
                       info={"with_plan": sum(u.kind.endswith("_plan") for u in units)})
