"""solve: the Solver answers questions, for the difficulty probe and for training.

Probe (`run_probe`): reads this iteration's generated questions that could earn the difficulty term
(valid verifier and s_q >= alpha); writes `iteration.n_probe` Solver rollouts each, without a plan
(purpose `probe`; these measure difficulty and are not trained on).
Solve (`run_solve`): reads this iteration's plans; writes `iteration.n_solve` Solver rollouts per plan
(purpose `solve`), shown the plan only when it passed the gate; `rollouts.plan_id` names the plan either way.
Idempotency key: rollout id. Fails: engine errors propagate; model output never fails the stage.
"""

from __future__ import annotations

from sage.configs.names import Purpose, Stage
from sage.stages.context import StageContext, StageReport
from sage.stages.rollouts import Unit, generate, question_fields
from sage.warehouse.queries import generated_questions, plans_for, questions_by_id


def run_probe(ctx: StageContext) -> StageReport:
    alpha = ctx.cfg.iteration.alpha
    questions = [q for q in generated_questions(ctx.wh, ctx.run_id, ctx.iteration)
                 if q["verifier_valid"] and q["s_q"] is not None and q["s_q"] >= alpha]
    units = [Unit(f"solver_{q['domain']}", q["question_id"], q["domain"], question_fields(q),
                  n=ctx.cfg.iteration.n_probe)
             for q in questions]
    _, written = generate(ctx, Stage.PROBE, Purpose.PROBE, units)
    return StageReport(Stage.PROBE, rows_in=len(questions), rows_out=written)


def run_solve(ctx: StageContext) -> StageReport:
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
        units.append(Unit(kind, q["question_id"], q["domain"], fields, n=ctx.cfg.iteration.n_solve,
                          plan_id=p["plan_id"]))
    _, written = generate(ctx, Stage.SOLVE, Purpose.SOLVE, units)
    return StageReport(Stage.SOLVE, rows_in=len(plans), rows_out=written,
                       info={"with_plan": sum(bool(p["passed"]) for p in plans)})
