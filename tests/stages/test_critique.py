"""critique (stages/critique.py) on a ScriptedLLM and an in-memory warehouse: the Critic's score of each new
question (s_q, malformed replies included) and of each plan (s_p and the gate at beta), which rows it reads and
writes, re-runs and batches."""

from __future__ import annotations

import pytest

from sage.configs.names import Purpose, Role, Stage
from sage.stages import critique, plan
from sage.stages.prompts import TEMPLATE_VERSION
from sage.warehouse import norm_hash
from tests.scripted import prompt_text

pytestmark = pytest.mark.fast

# new question: (the Critic's reply, the s_q it gives: (N - 1) / 9, the neutral 0.5 when unreadable)
RATED = {
    "What is 3+4?": ("Clear and solvable. <score>9</score>", 8 / 9),
    "What is 5+6?": ("Fine, I would give it a 7.", 6 / 9),           # no tag: the last integer 1..10
    "What is 7+8?": ("<score>11</score>", 0.5),                      # off the scale
    "What is 1+9?": ("<score>great</score>", 0.5),                   # no number
    "What is 2+9?": ("", 0.5),                                       # empty
    "What is 4+4?": ("Nonsense. <score>1</score>", 0.0),
}


def question(qid: str, text: str, origin: str = "generated", **extra) -> dict:
    row = dict(question_id=qid, origin=origin, domain="math", text=text, verifier={"answer": "1"},
               norm_hash=norm_hash(text))
    if origin == "generated":
        row.update(run_id="r", iteration=1, rollout_id=f"rollout-{qid}", verifier_valid=True)
    return {**row, **extra}


def problem(task: str) -> str:
    """The problem a Critic's prompt shows."""
    return task.split("Problem:\n", 1)[1].split("\n\n", 1)[0]


def critic(replies: dict[str, str]):
    return lambda req: replies[problem(prompt_text(req))]


def new_questions() -> list[dict]:
    rows = [question(f"q{k}", text) for k, text in enumerate(RATED)]
    return rows + [
        question("unparseable", "", s_q=0.0, admitted=False, rejection_reason="unparseable"),
        question("later", "What is 6+1?", iteration=2), question("other_run", "What is 6+2?", run_id="other"),
        question("seed", "What is 6+3?", "seed")]


def s_q(ctx) -> dict[str, float | None]:
    return {r["question_id"]: r["s_q"] for r in ctx.wh.rows("SELECT question_id, s_q FROM questions")}


def test_each_new_question_gets_its_critics_score(scripted_stage):
    ctx, llm = scripted_stage(critic({t: reply for t, (reply, _) in RATED.items()}))
    ctx.wh.insert_batch("questions", new_questions())
    report = critique.run_questions(ctx)

    got = s_q(ctx)
    assert {f"q{k}": got[f"q{k}"] for k in range(len(RATED))} == pytest.approx(
        {f"q{k}": score for k, (_, score) in enumerate(RATED.values())})
    # the unparseable question keeps its 0; other iterations, runs and seeds are not this stage's
    assert (got["unparseable"], got["later"], got["other_run"], got["seed"]) == (0.0, None, None, None)
    rollouts = ctx.wh.records("SELECT * FROM rollouts ORDER BY question_id")
    assert [r["question_id"] for r in rollouts] == [f"q{k}" for k in range(len(RATED))]
    assert all((r["stage"], r["role"], r["purpose"], r["template"], r["plan_id"], r["sample_index"])
               == (Stage.CRITIQUE_QUESTION, Role.CRITIC, Purpose.CRITIQUE_QUESTION, TEMPLATE_VERSION["critic_question"],
                   None, 0) for r in rollouts)
    assert [r["parsed"]["raw"] for r in rollouts] == [9, 7, None, None, None, 1]   # 11 is not read: off the scale
    assert [r["format_reward"] for r in rollouts] == [1.0, 0.0, 0.0, 0.0, 0.5, 1.0]
    assert report.rows_in == report.rows_out == len(RATED) and report.info == {"scored": len(RATED)}
    assert llm.calls == [len(RATED)]


# SAGE.md: a number off the 1..10 scale such as `1.0` gives the neutral 0.5, so no number the Critic writes off its
# scale can admit a question (a decimal already in [0, 1] was once kept as the score).
@pytest.mark.parametrize("reply", ["<score>1.0</score>", "<score>0.9</score>", "<score>10.0</score>",
                                   "<score>0</score>", "<score>11</score>", "<score>-2</score>", "It is 0.95 good."])
def test_a_score_off_the_critics_scale_is_neutral(scripted_stage, reply):
    ctx, _ = scripted_stage(lambda req: reply)
    ctx.wh.insert_batch("questions", [question("q", "What is 3+4?")])
    critique.run_questions(ctx)
    assert s_q(ctx)["q"] == 0.5


@pytest.mark.parametrize("reply,score", [("<score>10</score>", 1.0), ("<score>1</score>", 0.0),
                                         ("<score> 8 </score>", 7 / 9), ("<score>4/10</score>", 3 / 9),
                                         ("Solid. I give it 6.", 5 / 9)])
def test_an_integer_score_on_the_scale_is_read(scripted_stage, reply, score):
    ctx, _ = scripted_stage(lambda req: reply)
    ctx.wh.insert_batch("questions", [question("q", "What is 3+4?")])
    critique.run_questions(ctx)
    assert s_q(ctx)["q"] == pytest.approx(score)


def test_a_rerun_asks_nothing_and_sets_only_missing_scores(scripted_stage):
    ctx, llm = scripted_stage(critic({t: reply for t, (reply, _) in RATED.items()}), "run.batch_rows=4")
    ctx.wh.insert_batch("questions", new_questions())
    critique.run_questions(ctx)
    assert llm.calls == [4, 2]                          # whole batches of run.batch_rows
    before = s_q(ctx)
    again = critique.run_questions(ctx)
    assert again.rows_out == 0 and again.info == {"scored": 0} and llm.calls == [4, 2] and s_q(ctx) == before
    # a score already set stays; a lost one comes back from the stored Critic rollout, without asking the model
    ctx.wh.execute("UPDATE questions SET s_q = 0.25 WHERE question_id = 'q0'")
    ctx.wh.execute("UPDATE questions SET s_q = NULL WHERE question_id = 'q1'")
    again = critique.run_questions(ctx)
    assert again.info == {"scored": 1} and llm.calls == [4, 2]
    assert s_q(ctx) == {**before, "q0": 0.25}


# pool question: (the Critic's score of its plan, its s_p); beta is set to 1/3 = (4 - 1) / 9, which passes
PLANS = {
    "What is 2+2?": ("Good. <score>8</score>", 7 / 9, True),
    "What is 10-3?": ("Wrong. <score>2</score>", 1 / 9, False),
    "Compute 6*7.": ("Borderline. <score>4</score>", 3 / 9, True),       # s_p == beta passes
    "What is 9+1?": ("Weak. <score>3</score>", 2 / 9, False),
    "What is 8-5?": ("I cannot tell.", 0.5, True),                        # unreadable: neutral, above beta
}
BETA = "iteration.beta=0.3333333333333333"


def plan_of(question_text: str) -> str:
    return f"1. Read {question_text}\n2. Compute."


def planner_and_critic(req) -> str:
    task = prompt_text(req)
    if "numbered plan" in task:
        return f"<plan>\n{plan_of(problem(task))}\n</plan>"
    return PLANS[problem(task)][0]


def pool(ctx) -> None:
    ctx.wh.insert_batch("questions", [question(f"p{k}", text, "seed") for k, text in enumerate(PLANS)])


def test_each_plan_gets_its_critics_score_and_the_gate(scripted_stage):
    ctx, llm = scripted_stage(planner_and_critic, BETA, "iteration.n_plan=10")
    pool(ctx)
    plan.run(ctx)
    report = critique.run_plans(ctx)

    planned = {r["rollout_id"]: r for r in ctx.wh.records("SELECT * FROM rollouts WHERE purpose = 'plan'")}
    rows = ctx.wh.rows("SELECT * EXCLUDE (created_at) FROM plans")
    texts = {r["question_id"]: r["text"] for r in ctx.wh.rows("SELECT question_id, text FROM questions")}
    assert {r["plan_id"] for r in rows} == set(planned) and len(rows) == len(PLANS)
    for r in rows:
        _, s_p, passed = PLANS[texts[r["question_id"]]]
        assert r["question_id"] == planned[r["plan_id"]]["question_id"]
        assert (r["run_id"], r["iteration"], r["passed"]) == ("r", 1, passed)
        assert r["s_p"] == pytest.approx(s_p)
    critiques = ctx.wh.records("SELECT * FROM rollouts WHERE purpose = 'critique_plan'")
    assert sorted(r["plan_id"] for r in critiques) == sorted(planned)
    for r in critiques:
        assert (r["stage"], r["role"], r["template"], r["question_id"]) == (
            Stage.CRITIQUE_PLAN, Role.CRITIC, TEMPLATE_VERSION["critic_plan"], planned[r["plan_id"]]["question_id"])
    # the Critic was shown each question with its own plan
    shown = [prompt_text(r) for r in llm.requests if "Rate this plan" in prompt_text(r)]
    assert len(shown) == 5 and all(f"Plan:\n{plan_of(problem(t))}\n" in t for t in shown)
    assert report.rows_in == 5 and report.rows_out == 10 and report.info == {"passed": 3, "withheld": 2}


def test_a_plan_rerun_asks_nothing_and_writes_nothing(scripted_stage):
    ctx, llm = scripted_stage(planner_and_critic, BETA, "iteration.n_plan=10", "run.batch_rows=2")
    pool(ctx)
    plan.run(ctx)
    critique.run_plans(ctx)
    assert llm.calls == [2, 2, 1, 2, 2, 1]              # the plans, then their critiques, in whole batches
    before = ctx.wh.rows("SELECT * FROM plans ORDER BY plan_id")
    again = critique.run_plans(ctx)
    assert again.rows_out == 0 and llm.calls == [2, 2, 1, 2, 2, 1]
    assert ctx.wh.rows("SELECT * FROM plans ORDER BY plan_id") == before
