"""plan (stages/plan.py) on a ScriptedLLM and an in-memory warehouse: which pool questions it plans (seeds and
questions admitted up to this iteration), the Planner rollouts it writes, re-runs, batches, and sampling seeds
derived from row ids."""

from __future__ import annotations

import pytest

from sage.configs.names import Purpose, Role, Stage
from sage.stages import plan
from sage.stages.prompts import TEMPLATE_VERSION
from sage.stages.rollouts import Unit
from sage.warehouse import content_id, seed_from_id
from tests.scripted import prompt_text
from tests.stages.pool import question, seeds

pytestmark = pytest.mark.fast

def planner(req) -> str:
    """A plan naming the question; the question about 9+1 gets an answer without the tag."""
    problem = prompt_text(req).split("Problem:\n", 1)[1].split("\n", 1)[0]
    return "Just add them." if "9+1" in problem else f"<plan>\n1. Read: {problem}\n2. Compute.\n</plan>"


def snapshot(ctx) -> list[dict]:
    return ctx.wh.rows("SELECT * EXCLUDE (created_at) FROM rollouts ORDER BY rollout_id")


def test_plans_every_pool_question_of_the_iterations_domains(scripted_stage):
    ctx, llm = scripted_stage(planner, "iteration.n_plan=20", "iteration.domains=[math,code]", iteration=2)
    ctx.wh.insert_batch("questions", seeds(4) + [
        question("code", "Write add(a, b).", domain="code"),
        question("g_before", "What is 5+5?", "generated", run_id="r", iteration=1, admitted=True, admitted_iteration=1),
        question("g_now", "What is 6+6?", "generated", run_id="r", iteration=2, admitted=True, admitted_iteration=2),
        question("g_later", "What is 6+7?", "generated", run_id="r", iteration=3, admitted=True, admitted_iteration=3),
        question("g_rejected", "What is 4+3?", "generated", run_id="r", iteration=2, admitted=False),
        question("g_unjudged", "What is 4+5?", "generated", run_id="r", iteration=2),
        question("g_other_run", "What is 2+7?", "generated", run_id="other", iteration=1, admitted=True,
                 admitted_iteration=1),
        question("val", "What is 3+8?", "validation"), question("bench", "What is 9+9?", "benchmark")])
    report = plan.run(ctx)

    # seeds of both domains and this run's questions admitted up to and including this iteration (admit ran first)
    pool = {"s0", "s1", "s2", "s3", "code", "g_before", "g_now"}
    rows = ctx.wh.records("SELECT * FROM rollouts")
    assert sorted(r["question_id"] for r in rows) == sorted(pool)
    assert all((r["stage"], r["role"], r["purpose"], r["template"], r["plan_id"], r["sample_index"], r["iteration"])
               == (Stage.PLAN, Role.PLANNER, Purpose.PLAN, TEMPLATE_VERSION["planner"], None, 0, 2) for r in rows)
    texts = {q["question_id"]: q["text"] for q in ctx.wh.rows("SELECT question_id, text FROM questions")}
    for r in rows:
        text = texts[r["question_id"]]
        if "9+1" in text:
            assert (r["parsed"], r["format_reward"], r["format_reason"]) == ({"plan": None}, 0.0, "missing <plan>")
        else:
            assert (r["parsed"], r["format_reward"]) == ({"plan": f"1. Read: {text}\n2. Compute."}, 1.0)
    assert report.rows_in == report.rows_out == len(pool) and llm.calls == [len(pool)]

    math_only, _ = scripted_stage(planner, "iteration.n_plan=20", "iteration.domains=[math]", wh=ctx.wh, iteration=3)
    plan.run(math_only)
    planned = {r["question_id"] for r in ctx.wh.rows("SELECT question_id FROM rollouts WHERE iteration = 3")}
    assert planned == {"s0", "s1", "s2", "s3", "g_before", "g_now", "g_later"}


def test_draws_and_seeds_derive_from_the_run_seed_run_and_iteration(scripted_stage):
    def drawn(*overrides: str, iteration: int = 1) -> list[dict]:
        ctx, llm = scripted_stage(planner, "iteration.n_plan=3", *overrides, iteration=iteration)
        ctx.wh.insert_batch("questions", seeds(8))
        plan.run(ctx)
        rows = ctx.wh.rows("SELECT rollout_id, question_id, seed FROM rollouts ORDER BY question_id")
        for r in rows:   # ids and request seeds are hashes of what determines the row
            unit = Unit("planner", r["question_id"], "math", {})
            assert r["rollout_id"] == unit.rollout_id(ctx, Purpose.PLAN, 0) == content_id(
                "rollout", content_id("unit", "r", iteration, Purpose.PLAN, r["question_id"], None,
                                      TEMPLATE_VERSION["planner"]), 0)
            assert r["seed"] == seed_from_id(content_id(ctx.cfg.run.seed, unit.unit_id(ctx, Purpose.PLAN)))
        assert sorted(r.seed for r in llm.requests) == sorted(r["seed"] for r in rows)
        return rows

    first = drawn()
    assert len(first) == 3 and drawn() == first                   # a fresh warehouse draws the same questions
    assert {r["seed"] for r in drawn("run.seed=1")}.isdisjoint(r["seed"] for r in first)
    assert len({tuple(r["question_id"] for r in drawn(iteration=i)) for i in (1, 2, 3, 4)}) > 1


def test_a_rerun_regenerates_only_what_is_missing_with_the_same_seed(scripted_stage):
    ctx, llm = scripted_stage(planner, "iteration.n_plan=5", "run.batch_rows=2")
    ctx.wh.insert_batch("questions", seeds(6))
    first = plan.run(ctx)
    assert first.rows_out == 5 and llm.calls == [2, 2, 1]         # whole batches of run.batch_rows
    before = snapshot(ctx)
    again = plan.run(ctx)
    assert (again.rows_in, again.rows_out) == (5, 0) and llm.calls == [2, 2, 1] and snapshot(ctx) == before
    lost = before[2]
    ctx.wh.execute("DELETE FROM rollouts WHERE rollout_id = ?", [lost["rollout_id"]])
    assert plan.run(ctx).rows_out == 1 and llm.calls == [2, 2, 1, 1]
    assert llm.requests[-1].seed == lost["seed"] and snapshot(ctx) == before


def test_a_generated_share_plans_admitted_questions_and_the_report_counts_them(scripted_stage):
    """`iteration.generated_share` 0.5 of 4: two of the planned questions are admitted ones, the newest first; with
    one admitted the report says one drawn of two asked (the seeds filled the rest); without the setting the report
    has no curriculum counts."""
    ctx, _ = scripted_stage(planner, "iteration.n_plan=4", "iteration.generated_share=0.5", iteration=2)
    ctx.wh.insert_batch("questions", seeds(8) + [
        question("g_old", "What is 5+5?", "generated", run_id="r", iteration=1, admitted=True, admitted_iteration=1)])
    report = plan.run(ctx)
    planned = [r["question_id"] for r in ctx.wh.rows("SELECT question_id FROM rollouts")]
    assert "g_old" in planned and len(planned) == 4
    assert report.info == {"generated_asked": 2, "generated_drawn": 1}

    plain, _ = scripted_stage(planner, "iteration.n_plan=4", wh=ctx.wh, iteration=3)
    assert plan.run(plain).info == {}
