"""solve (stages/solve.py) on a ScriptedLLM and an in-memory warehouse: which new questions the difficulty probe
answers (valid verifier, s_q >= alpha), the Solver's answers to planned questions with the plan shown only when
it passed the gate, the parsed answers, re-runs and batches."""

from __future__ import annotations

import pytest

from sage.configs.names import Purpose, Role, Stage
from sage.stages import plan, solve
from sage.stages.prompts import TEMPLATE_VERSION
from sage.stages.rollouts import Unit
from sage.warehouse import content_id, norm_hash, seed_from_id
from tests.scripted import prompt_text

pytestmark = pytest.mark.fast

# the Solver's samples of every question, and the answers parsed from them
ANSWERS = ["Six and one. <answer>\\boxed{7}</answer>", "So it is \\boxed{8}.", "I do not know."]
PARSED = [("\\boxed{7}", 1.0), ("\\boxed{8}", 0.0), (None, 0.0)]


def question(qid: str, text: str, origin: str = "generated", **extra) -> dict:
    row = dict(question_id=qid, origin=origin, domain="math", text=text, verifier={"answer": "7"},
               norm_hash=norm_hash(text))
    if origin == "generated":
        row.update(run_id="r", iteration=1, rollout_id=f"rollout-{qid}")
    return {**row, **extra}


def solver(req) -> list[str]:
    return ANSWERS[:req.n]


def snapshot(ctx) -> list[dict]:
    return ctx.wh.rows("SELECT * EXCLUDE (created_at) FROM rollouts ORDER BY rollout_id")


def test_the_probe_answers_questions_that_can_earn_difficulty(scripted_stage):
    ctx, llm = scripted_stage(solver, "iteration.n_probe=3", "iteration.alpha=0.7")
    ctx.wh.insert_batch("questions", [
        question("good", "What is 3+4?", s_q=0.9, verifier_valid=True),
        question("at_alpha", "What is 2+5?", s_q=0.7, verifier_valid=True),
        question("low", "What is 1+6?", s_q=0.6, verifier_valid=True),
        question("invalid", "What is 0+7?", s_q=0.9, verifier_valid=False),
        question("unscored", "What is 7+0?", verifier_valid=True),
        question("later", "What is 5+2?", s_q=0.9, verifier_valid=True, iteration=2),
        question("other_run", "What is 4+3?", s_q=0.9, verifier_valid=True, run_id="other"),
        question("seed", "What is 6+1?", "seed")])
    report = solve.run_probe(ctx)

    rows = ctx.wh.records("SELECT * FROM rollouts ORDER BY question_id, sample_index")
    probed = [(q, j) for q in ("at_alpha", "good") for j in range(3)]     # alpha itself passes
    assert [(r["question_id"], r["sample_index"]) for r in rows] == probed
    assert all((r["stage"], r["role"], r["purpose"], r["template"], r["plan_id"])
               == (Stage.PROBE, Role.SOLVER, Purpose.PROBE, TEMPLATE_VERSION["solver_math"], None) for r in rows)
    assert [(r["parsed"]["answer"], r["format_reward"]) for r in rows] == PARSED * 2
    assert [r["completion_text"] for r in rows] == ANSWERS * 2
    for r in rows:      # one request per question; its samples share the request's seed, each has its own id
        unit = Unit("solver_math", r["question_id"], "math", {}, n=3)
        assert r["rollout_id"] == unit.rollout_id(ctx, Purpose.PROBE, r["sample_index"])
        assert r["seed"] == seed_from_id(content_id(ctx.cfg.run.seed, unit.unit_id(ctx, Purpose.PROBE)))
    assert llm.calls == [2] and [r.n for r in llm.requests] == [3, 3]
    assert all("Plan (follow it)" not in prompt_text(r) for r in llm.requests)
    assert (report.stage, report.rows_in, report.rows_out) == (Stage.PROBE, 2, 6)

    before = snapshot(ctx)
    again = solve.run_probe(ctx)
    assert again.rows_out == 0 and llm.calls == [2] and snapshot(ctx) == before


# pool question: whether its plan passed the gate
GATED = {"What is 2+2?": True, "What is 10-3?": False, "Compute 6*7.": True}


def plan_of(problem: str) -> str:
    return f"1. Read: {problem}\n2. Compute."


def problem_of(task: str) -> str:
    return task.split("Problem:\n", 1)[1].split("\n", 1)[0]


def planner_and_solver(req) -> str | list[str]:
    task = prompt_text(req)
    if "numbered plan" in task:
        return f"<plan>\n{plan_of(problem_of(task))}\n</plan>"
    return solver(req)


def planned(scripted_stage, *overrides: str):
    """A context whose iteration planned every pool question, each plan's gate decided as GATED says."""
    ctx, llm = scripted_stage(planner_and_solver, "iteration.n_plan=10", "iteration.n_solve=2", *overrides)
    ctx.wh.insert_batch("questions", [question(f"p{k}", t, "seed") for k, t in enumerate(GATED)])
    plan.run(ctx)
    plans = ctx.wh.rows("SELECT r.rollout_id, r.question_id, q.text FROM rollouts r JOIN questions q USING "
                        "(question_id) WHERE r.purpose = 'plan'")
    ctx.wh.insert_batch("plans", [dict(plan_id=p["rollout_id"], run_id="r", iteration=1, question_id=p["question_id"],
                                       s_p=0.9 if GATED[p["text"]] else 0.1, passed=GATED[p["text"]]) for p in plans])
    llm.calls.clear()
    llm.requests.clear()
    return ctx, llm, {p["rollout_id"]: p["text"] for p in plans}


def test_the_solver_sees_a_plan_only_when_it_passed_the_gate(scripted_stage):
    ctx, llm, plans = planned(scripted_stage)
    report = solve.run_solve(ctx)

    rows = ctx.wh.records("SELECT * FROM rollouts WHERE purpose = 'solve' ORDER BY plan_id, sample_index")
    assert [(r["plan_id"], r["sample_index"]) for r in rows] == [(p, j) for p in sorted(plans) for j in range(2)]
    for r in rows:
        shown = GATED[plans[r["plan_id"]]]
        kind = "solver_math_plan" if shown else "solver_math"
        assert (r["stage"], r["role"], r["template"]) == (Stage.SOLVE, Role.SOLVER, TEMPLATE_VERSION[kind])
        assert (f"Plan (follow it):\n{plan_of(plans[r['plan_id']])}" in r["prompt_text"]) == shown
        assert (r["parsed"]["answer"], r["format_reward"]) == PARSED[r["sample_index"]]
    # the request's last message is the task: the plan is in it exactly when it passed
    tasks = [prompt_text(r) for r in llm.requests]
    assert sorted(("Plan (follow it):" in t, problem_of(t)) for t in tasks) == sorted((v, k) for k, v in GATED.items())
    assert llm.calls == [3] and [r.n for r in llm.requests] == [2, 2, 2]
    assert [r["plan_shown"] for r in rows] == [GATED[plans[r["plan_id"]]] for r in rows]
    assert report.rows_in == 3 and report.rows_out == 6
    assert report.info == {"with_plan": 4, "without": 2, "generated_share": 0.0}


def test_mixed_hints_show_a_passed_plan_to_a_share_of_its_answers_and_the_rest_answer_plainly(scripted_stage):
    """`iteration.hints` mixed: a question whose plan passed gets `hint_share` of its answers with the plan and the
    rest with the plain prompt validation uses, all naming the plan; a withheld plan's answers are all plain. The
    answers shown the plan are the ones `always` writes (the same ids), so `always` runs keep their rows."""
    ctx, llm, plans = planned(scripted_stage, "iteration.hints=mixed", "iteration.hint_share=0.5")
    report = solve.run_solve(ctx)
    rows = ctx.wh.records("SELECT * FROM rollouts WHERE purpose = 'solve' ORDER BY plan_id, plan_shown, sample_index")
    expected = []
    for p in sorted(plans):
        expected += [(p, False, 0)] + ([(p, True, 0)] if GATED[plans[p]] else [(p, False, 1)])
    assert [(r["plan_id"], r["plan_shown"], r["sample_index"]) for r in rows] == expected
    for r in rows:
        kind = "solver_math_plan" if r["plan_shown"] else "solver_math"
        assert r["template"] == TEMPLATE_VERSION[kind]
        assert ("Plan (follow it):" in r["prompt_text"]) == r["plan_shown"]
    assert len({r["rollout_id"] for r in rows}) == 6
    assert (report.rows_in, report.rows_out, report.info) == (3, 6, {"with_plan": 2, "without": 4,
                                                                     "generated_share": 0.0})
    plain = {r["question_id"]: r["prompt_ids"] for r in rows if not r["plan_shown"]}
    assert len(set(map(tuple, plain.values()))) == 3         # one plain prompt per question

    shown = {r["rollout_id"] for r in rows if r["plan_shown"]}
    always, _, _ = planned(scripted_stage)
    solve.run_solve(always)
    assert shown <= {r["rollout_id"] for r in always.wh.rows("SELECT rollout_id FROM rollouts WHERE plan_shown")}


def test_a_shown_plan_never_changes_an_answers_reward(scripted_stage):
    """With mixed hints, an answer shown the plan and one without it, equally right and equally formatted, earn the
    same reward: s~_p is the plan's score for every answer to a question whose plan passed."""
    from sage.stages import score

    ctx, _, plans = planned(scripted_stage, "iteration.hints=mixed", "iteration.hint_share=0.5")
    solve.run_solve(ctx)
    rows = ctx.wh.rows("SELECT rollout_id FROM rollouts WHERE purpose = 'solve'")
    ctx.wh.insert_batch("verdicts", [dict(rollout_id=r["rollout_id"], run_id="r", iteration=1, kind="math", s_gt=1.0)
                                     for r in rows])
    score.run(ctx)
    rewards = ctx.wh.records("""SELECT r.plan_id, r.plan_shown, s.reward, s.components FROM scores s JOIN rollouts r
                                USING (rollout_id) WHERE r.purpose = 'solve' AND r.sample_index = 0""")
    passed = [p for p in plans if GATED[plans[p]]]
    for p in passed:
        shown, plain = ([r for r in rewards if r["plan_id"] == p and r["plan_shown"] is v] for v in (True, False))
        assert len(shown) == len(plain) == 1 and shown[0]["reward"] == pytest.approx(plain[0]["reward"])
        assert shown[0]["components"]["s_p_tilde"] == plain[0]["components"]["s_p_tilde"] == pytest.approx(0.9)


class EqualChecker:
    """The math checker's interface: an answer is right when it is the gold answer's text."""

    def check_many(self, pairs: list[tuple[str, str]]) -> list[float]:
        return [float(bool(gold) and gold == pred) for gold, pred in pairs]


def hinted_or_not(req) -> str | list[str]:
    """The Planner plans; shown a plan the Solver is right; plainly it is wrong on 2+2 and 10-3, right on 6*7."""
    task = prompt_text(req)
    if "numbered plan" in task:
        return f"<plan>\n{plan_of(problem_of(task))}\n</plan>"
    right = "Plan (follow it)" in task or "6*7" in task
    return ["<answer>\\boxed{7}</answer>" if right else "<answer>\\boxed{5}</answer>"] * req.n


def test_hints_on_failure_show_the_plan_only_where_every_plain_answer_failed(scripted_stage):
    """`iteration.hints` on_failure: every question gets n_solve plain answers, verified in the stage; only a question
    whose plan passed and whose plain answers all failed (2+2; 10-3's plan was withheld, 6*7 was solved) gets
    hint_share x n_solve more answers shown its plan. A re-run generates and verifies nothing."""
    ctx, llm = scripted_stage(hinted_or_not, "iteration.n_plan=10", "iteration.n_solve=4", "iteration.hints=on_failure",
                              "iteration.hint_share=0.5", mathcheck=EqualChecker())
    ctx.wh.insert_batch("questions", [question(f"p{k}", t, "seed") for k, t in enumerate(GATED)])
    plan.run(ctx)
    plans = ctx.wh.rows("SELECT r.rollout_id, q.text FROM rollouts r JOIN questions q USING (question_id) "
                        "WHERE r.purpose = 'plan'")
    ctx.wh.insert_batch("plans", [dict(plan_id=p["rollout_id"], run_id="r", iteration=1, question_id=f"p{k}",
                                       s_p=0.9 if GATED[p["text"]] else 0.1, passed=GATED[p["text"]])
                                  for p in plans for k, t in enumerate(GATED) if t == p["text"]])
    report = solve.run_solve(ctx)
    rows = ctx.wh.rows("""SELECT q.text, r.plan_shown, count(*) AS n, count(v.rollout_id) AS verified
                          FROM rollouts r JOIN questions q USING (question_id)
                          LEFT JOIN verdicts v ON v.rollout_id = r.rollout_id
                          WHERE r.purpose = 'solve' GROUP BY ALL ORDER BY ALL""")
    assert [(r["text"], r["plan_shown"], r["n"], r["verified"]) for r in rows] == [
        ("Compute 6*7.", False, 4, 4), ("What is 10-3?", False, 4, 4), ("What is 2+2?", False, 4, 4),
        ("What is 2+2?", True, 2, 0)]                       # the hinted answers are left to the verify stage
    assert report.rows_out == 14 and report.info == {"with_plan": 2, "without": 12, "generated_share": 0.0}
    calls = len(llm.calls)
    assert solve.run_solve(ctx).rows_out == 0 and len(llm.calls) == calls


@pytest.mark.parametrize("share, n_solve", [(0.1, 4), (0.9, 4), (0.5, 1)])
def test_mixed_hints_need_answers_with_and_without_the_plan(share, n_solve):
    from sage.configs import load_config

    with pytest.raises(ValueError, match="leaves no answer with or none without"):
        load_config("cpu", ["iteration.hints=mixed", f"iteration.hint_share={share}", f"iteration.n_solve={n_solve}"])
    assert solve.hint_count(8, "mixed", 0.5) == 4 and solve.hint_count(8, "always", 0.5) == 8


def test_a_solve_rerun_regenerates_only_what_is_missing(scripted_stage):
    ctx, llm, _ = planned(scripted_stage, "run.batch_rows=2")
    solve.run_solve(ctx)
    assert llm.calls == [2, 1]                          # whole batches of run.batch_rows units
    before = snapshot(ctx)
    assert solve.run_solve(ctx).rows_out == 0 and llm.calls == [2, 1] and snapshot(ctx) == before
    lost = next(r for r in before if r["purpose"] == "solve" and r["sample_index"] == 1)
    ctx.wh.execute("DELETE FROM rollouts WHERE rollout_id = ?", [lost["rollout_id"]])
    report = solve.run_solve(ctx)
    # the unit is asked again whole (n samples, the same seed); only the missing sample is written
    assert report.rows_out == 1 and llm.calls == [2, 1, 1] and llm.requests[-1].n == 2
    assert llm.requests[-1].seed == lost["seed"] and snapshot(ctx) == before


def test_without_the_planner_the_solver_answers_the_sampled_questions_as_after_a_withheld_plan(scripted_stage):
    """`iteration.planner` false: no plans exist; the solve stage answers the `n_plan` pool questions the plan stage
    would have sampled, each with the no-plan prompt a withheld plan gets, and names no plan."""
    ctx, llm = scripted_stage(solver, "iteration.n_plan=2", "iteration.n_solve=2", "iteration.planner=false")
    ctx.wh.insert_batch("questions", [question(f"p{k}", t, "seed") for k, t in enumerate(GATED)])
    sampled = sorted(q["question_id"] for q in plan.sample(ctx))
    report = solve.run_solve(ctx)

    rows = ctx.wh.records("SELECT * FROM rollouts ORDER BY question_id, sample_index")
    assert [(r["question_id"], r["sample_index"]) for r in rows] == [(q, j) for q in sampled for j in range(2)]
    assert len(sampled) == 2 and plan.run(ctx).rows_out == 0 and ctx.wh.count("rollouts") == 4  # a sample, no plan
    assert all((r["purpose"], r["plan_id"], r["template"]) == (Purpose.SOLVE, None, TEMPLATE_VERSION["solver_math"])
               for r in rows)
    assert [prompt_text(r) for r in llm.requests] and all("Plan (follow it)" not in prompt_text(r)
                                                          for r in llm.requests)
    assert (report.rows_in, report.rows_out, report.info) == (2, 4, {"with_plan": 0, "without": 4,
                                                                     "generated_share": 0.0})
    assert all(r["plan_shown"] is False for r in rows)
    assert solve.run_solve(ctx).rows_out == 0 and len(llm.requests) == 2  # a re-run asks nothing


def test_the_solve_line_gives_the_generated_share_of_the_solvers_answers(scripted_stage):
    """`iteration.generated_share` 0.5 of `n_plan` 2 asks one admitted question of the sample, and the solve report
    gives the generated share of the answers and how many generated questions were asked for and drawn; a pool with
    no admitted question falls back to the seeds and says so (asked 1, drawn 0)."""
    ctx, _ = scripted_stage(solver, "iteration.n_plan=2", "iteration.n_solve=2", "iteration.planner=false",
                            "iteration.generated_share=0.5", iteration=2)
    ctx.wh.insert_batch("questions", [question(f"p{k}", t, "seed") for k, t in enumerate(GATED)] + [
        question("g2", "What is 6+6?", "generated", run_id="r", iteration=2, admitted=True, admitted_iteration=2),
        question("g3", "What is 5+5?", "generated", run_id="r", iteration=3, admitted=True, admitted_iteration=3)])
    report = solve.run_solve(ctx)
    answered = ctx.wh.rows("SELECT question_id, count(*) AS n FROM rollouts GROUP BY ALL ORDER BY ALL")
    assert len(answered) == 2 and answered[0] == {"question_id": "g2", "n": 2}   # g3: not admitted by iteration 2
    assert report.info == {"with_plan": 0, "without": 4, "generated_share": 0.5, "generated_asked": 1,
                           "generated_drawn": 1}
    assert ctx.wh.rows("SELECT * FROM solver_curriculum") == [
        {"run_id": "r", "iteration": 2, "answers": 4, "generated_answers": 2, "generated_share": 0.5, "questions": 2,
         "generated_questions": 1, "generated_asked": 0}]   # no `runs` row: no config, so none asked
    ctx.wh.insert_batch("runs", [{"run_id": "r", "config": ctx.cfg.model_dump(mode="json"), "config_hash": "h",
                                  "base_model": "m", "seed": 0}])
    assert ctx.wh.rows("SELECT generated_asked FROM solver_curriculum") == [{"generated_asked": 1}]

    seeds_only, _ = scripted_stage(solver, "iteration.n_plan=2", "iteration.n_solve=2", "iteration.planner=false",
                                   "iteration.generated_share=0.5")
    seeds_only.wh.insert_batch("questions", [question(f"p{k}", t, "seed") for k, t in enumerate(GATED)])
    assert solve.run_solve(seeds_only).info == {"with_plan": 0, "without": 4, "generated_share": 0.0,
                                                "generated_asked": 1, "generated_drawn": 0}
