"""solve: the Solver answers questions, for the difficulty probe and for training.

Probe (`run_probe`): reads this iteration's generated questions that could earn the difficulty term
(valid verifier and s_q >= alpha); writes `iteration.n_probe` Solver rollouts each, without a plan
(purpose `probe`; these measure difficulty and are not trained on); nothing with `iteration.challenger` false.
Solve (`run_solve`): reads this iteration's plans; writes `iteration.n_solve` Solver rollouts per plan
(purpose `solve`). A plan that failed the gate is shown to none of them. One that passed is shown to all of them
(`iteration.hints` always, SAGE.md) or, as a hint, to `hint_count` of them (`mixed`), the rest answering the plain
question, as validation asks it, in the same TRR++ group. With `on_failure` every answer is plain, the stage
verifies them itself (as validate does; `verify` then finds them done), and a question whose plan passed and whose
plain answers all failed (s_gt < 1) gets `hint_count` more answers shown the plan (self-hinting RL, Guide).
`rollouts.plan_id` names the plan either way and `rollouts.plan_shown` says whether the prompt showed it.
Its report gives the generated share of the Solver's answers (`solver_curriculum`; `iteration.generated_share`).
With `iteration.planner` false (an ablation) it answers the pool questions the plan stage would have sampled,
each without a plan, the prompt of a withheld plan, and `rollouts.plan_id` is NULL (so s~_p = 0).
Idempotency key: rollout id. Fails: engine errors propagate; model output never fails the stage.
"""
# pyright: basic

from __future__ import annotations

from sage.configs.names import Purpose, Stage
from sage.stages import plan
from sage.stages.context import RunContext, StageReport, switched_off
from sage.stages.prompts import PromptKind
from sage.stages.rollouts import Unit, generate, question_fields
from sage.stages.verify import verify_rollouts
from sage.warehouse.queries import (
    best_plain_answers,
    generated_questions,
    plans_for,
    questions_by_id,
    solver_curriculum,
)


def run_probe(ctx: RunContext) -> StageReport:
    if not ctx.cfg.iteration.challenger:
        return switched_off(Stage.PROBE, "iteration.challenger")
    alpha = ctx.cfg.iteration.alpha
    questions = [q for q in generated_questions(ctx.wh, ctx.run_id, ctx.iteration)
                 if q["verifier_valid"] and q["s_q"] is not None and q["s_q"] >= alpha]
    units = [Unit(PromptKind.solver(q["domain"]), q["question_id"], q["domain"], question_fields(q),
                  n=ctx.cfg.iteration.n_probe)
             for q in questions]
    _, written = generate(ctx, Stage.PROBE, Purpose.PROBE, units)
    return StageReport(Stage.PROBE, rows_in=len(questions), rows_out=written)


def hint_count(n_solve: int, hints: str, share: float) -> int:
    """How many of a question's answers see its plan when the plan passed the gate: all `n_solve` with `always`;
    with `mixed`, `share` of them rounded, at least one and at most all but one (the config refuses a share that
    rounds to none or to all); with `on_failure`, `share` of `n_solve` rounded, at least one, beside its `n_solve`
    plain answers."""
    if hints == "always":
        return n_solve
    return min(max(round(share * n_solve), 1), n_solve - 1 if hints == "mixed" else n_solve)


def _units(ctx: RunContext) -> list[Unit]:
    """The Solver's units: per plan, one shown the plan (when it passed the gate, `hint_count` answers) and one
    without it (the other answers); without the Planner, one per sampled pool question, without a plan."""
    n, it = ctx.cfg.iteration.n_solve, ctx.cfg.iteration
    if not it.planner:
        return [Unit(PromptKind.solver(q["domain"]), q["question_id"], q["domain"], question_fields(q), n=n)
                for q in plan.sample(ctx)]
    plans = plans_for(ctx.wh, ctx.run_id, ctx.iteration)
    qs = questions_by_id(ctx.wh, [p["question_id"] for p in plans])
    units = []
    for p in plans:
        q = qs[p["question_id"]]
        shown = hint_count(n, it.hints, it.hint_share) if p["passed"] and it.hints != "on_failure" else 0
        if shown:
            units.append(_shown(q, p, shown))
        if n - shown:
            units.append(Unit(PromptKind.solver(q["domain"]), q["question_id"], q["domain"], question_fields(q),
                              n=n - shown, plan_id=p["plan_id"]))
    return units


def _shown(q: dict, p: dict, n: int) -> Unit:
    """A unit of `n` answers to question `q` shown its plan `p`."""
    return Unit(PromptKind.solver(q["domain"], plan=True), q["question_id"], q["domain"],
                question_fields(q, p["parsed"].get("plan") or ""), n=n, plan_id=p["plan_id"])


def _hints_after_failure(ctx: RunContext) -> list[Unit]:
    """`on_failure`: the plain answers verified, a unit shown the plan for every question whose plan passed and
    whose plain answers all failed."""
    verify_rollouts(ctx, Purpose.SOLVE, "solve_verify")
    best = best_plain_answers(ctx.wh, ctx.run_id, ctx.iteration)
    failed = [p for p in plans_for(ctx.wh, ctx.run_id, ctx.iteration)
              if p["passed"] and best.get(p["plan_id"], 1.0) < 1.0]
    qs = questions_by_id(ctx.wh, [p["question_id"] for p in failed])
    it = ctx.cfg.iteration
    return [_shown(qs[p["question_id"]], p, hint_count(it.n_solve, it.hints, it.hint_share)) for p in failed]


def run_solve(ctx: RunContext) -> StageReport:
    units = _units(ctx)
    _, written = generate(ctx, Stage.SOLVE, Purpose.SOLVE, units)
    if ctx.cfg.iteration.planner and ctx.cfg.iteration.hints == "on_failure":
        hinted = _hints_after_failure(ctx)
        written += generate(ctx, Stage.SOLVE, Purpose.SOLVE, hinted)[1]
        units += hinted
    return StageReport(Stage.SOLVE, rows_in=len({(u.question_id, u.plan_id) for u in units}), rows_out=written,
                       info={"with_plan": sum(u.n for u in units if u.kind.shows_plan),
                             "without": sum(u.n for u in units if not u.kind.shows_plan),
                             **_curriculum_info(ctx)})


def _curriculum_info(ctx: RunContext) -> dict:
    """The generated share of the iteration's Solver answers (`make run`'s solve line) and, with
    `iteration.generated_share`, the generated questions asked for and drawn (`solver_curriculum`)."""
    row = solver_curriculum(ctx.wh, ctx.run_id, ctx.iteration)
    info = {"generated_share": round(row.get("generated_share") or 0.0, 3)}
    if ctx.cfg.iteration.generated_share:
        info.update(generated_asked=plan.curriculum(ctx), generated_drawn=row.get("generated_questions", 0))
    return info
