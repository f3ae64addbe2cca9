"""challenge (stages/challenge.py) on a ScriptedLLM, an in-memory warehouse and a scripted math checker: which
references it draws from the pool, the question rows it writes from the Challenger's output (unparseable and
invalid ones kept with their reason), re-runs, batches and sampling seeds.

Math references only: a code question's reference solution runs in the sandbox, a subprocess this tier never
starts (the stage calls `ctx.sandbox` directly, not through the fan-out); code questions are covered end to end
in tests/flows. The stage asks for the sandbox even with no code question, so these tests give it one that
runs nothing."""

from __future__ import annotations

import pytest

from sage.configs.names import Purpose, Role, Stage
from sage.stages import challenge
from sage.stages.prompts import TEMPLATE_VERSION
from sage.stages.rollouts import Unit
from sage.warehouse import content_id, norm_hash, seed_from_id
from tests.scripted import prompt_text
from tests.stages.pool import question, seeds

pytestmark = pytest.mark.fast

def new_question(reference: str) -> tuple[str, str]:
    """The (question, answer) the scripted Challenger writes for a reference."""
    return f"{reference} Then add one.", str(len(reference))


def challenger(replies: dict[str, str] | None = None):
    """The Challenger's reply to each reference: `replies[reference]`, else a well-formed new question."""
    def script(req):
        task = prompt_text(req)
        reference = task.split("Reference problem:\n", 1)[1].split("\n\n", 1)[0]
        if replies and reference in replies:
            return replies[reference]
        q, a = new_question(reference)
        return f"<question>{q}</question>\n<answer>{a}</answer>"
    return script


class ScriptedChecker:
    """The math checker's interface on known answers: an answer is equivalent to itself unless it is empty or in
    `broken` (answers math-verify would not parse). Records every batch it is asked."""

    def __init__(self, broken: tuple[str, ...] = ()):
        self.broken = set(broken)
        self.asked: list[list[tuple[str, str]]] = []

    def check_many(self, pairs: list[tuple[str, str]]) -> list[float]:
        self.asked.append(list(pairs))
        return [1.0 if gold and gold == pred and gold not in self.broken else 0.0 for gold, pred in pairs]


class NoCodeSandbox:
    """The sandbox's interface for math-only batches: it must never be given a job."""

    def execute(self, jobs: list) -> list:
        assert not jobs, "a math-only batch ran code"
        return []


def context(scripted_stage, script, *overrides: str, iteration: int = 1, checker: ScriptedChecker | None = None):
    return scripted_stage(script, "iteration.domains=[math]", *overrides, iteration=iteration,
                          mathcheck=checker or ScriptedChecker(), sandbox=NoCodeSandbox())


def generated(ctx) -> dict[str, dict]:
    """The questions the Challenger's rollouts wrote, by parent (the reference each was written from)."""
    rows = ctx.wh.records("SELECT * EXCLUDE (created_at) FROM questions WHERE rollout_id IN "
                          "(SELECT rollout_id FROM rollouts WHERE purpose = 'challenge')")
    return {r["parent_id"]: r for r in rows}


def snapshot(ctx) -> tuple[list[dict], list[dict]]:
    return (ctx.wh.rows("SELECT * EXCLUDE (created_at) FROM rollouts ORDER BY rollout_id"),
            ctx.wh.rows("SELECT * EXCLUDE (created_at) FROM questions ORDER BY question_id"))


def test_one_question_per_pool_reference_with_its_parent_verifier_and_id(scripted_stage):
    checker = ScriptedChecker()
    ctx, llm = context(scripted_stage, challenger(), "iteration.n_challenge=20", iteration=2, checker=checker)
    ctx.wh.insert_batch("questions", seeds() + [
        question("g_pool", "What is 5+5?", "generated", run_id="r", iteration=1, admitted=True, admitted_iteration=1),
        question("g_now", "What is 6+6?", "generated", run_id="r", iteration=2, admitted=True, admitted_iteration=2),
        question("g_rejected", "What is 4+3?", "generated", run_id="r", iteration=1, admitted=False),
        question("g_other_run", "What is 2+7?", "generated", run_id="other", iteration=1, admitted=True,
                 admitted_iteration=1),
        question("val", "What is 3+8?", "validation"), question("bench", "What is 9+9?", "benchmark"),
        question("code", "Write add(a, b).", domain="code")])
    report = challenge.run(ctx)

    pool = {"s0", "s1", "s2", "s3", "g_pool"}   # seeds + admitted before this iteration, math only
    rollouts = ctx.wh.records("SELECT * FROM rollouts")
    assert {r["question_id"] for r in rollouts} == pool and len(rollouts) == len(pool)
    assert all((r["stage"], r["role"], r["purpose"], r["template"], r["sample_index"], r["iteration"], r["plan_id"])
               == (Stage.CHALLENGE, Role.CHALLENGER, Purpose.CHALLENGE, TEMPLATE_VERSION["challenger_math"], 0, 2,
                   None) for r in rollouts)
    got = generated(ctx)
    assert set(got) == pool
    texts = {r["question_id"]: r["text"] for r in ctx.wh.rows("SELECT question_id, text FROM questions")}
    for r in rollouts:
        q = got[r["question_id"]]
        text, answer = new_question(texts[r["question_id"]])
        assert q["question_id"] == content_id("question", "generated", r["rollout_id"])
        assert (q["rollout_id"], q["text"], q["verifier"], q["norm_hash"], q["domain"], q["source"]) == \
            (r["rollout_id"], text, {"answer": answer}, norm_hash(text), "math", "challenger")
        assert (q["run_id"], q["iteration"], q["verifier_valid"], q["verifier_error"]) == ("r", 2, True, None)
        assert (q["s_q"], q["admitted"], q["rejection_reason"]) == (None, None, None)  # critique and admit decide
        assert r["parsed"] == {"question": text, "answer": answer} and r["format_reward"] == 1.0
    assert sorted(p for batch in checker.asked for p in batch) == sorted((q["verifier"]["answer"],) * 2
                                                                         for q in got.values())
    assert report.rows_in == 5 and report.rows_out == 10 and report.info == {"rollouts": 5, "questions": 5}
    assert llm.calls == [5]


def test_unparseable_and_invalid_outputs_are_kept_with_their_reason(scripted_stage):
    refs = seeds(5)
    replies = {refs[0]["text"]: "I cannot think of one.",
               refs[1]["text"]: "",
               refs[2]["text"]: "<question>How many legs do 3 cats have?</question>",
               refs[3]["text"]: "<question>What is 5/0?</question>\n<answer>undefined</answer>"}
    checker = ScriptedChecker(broken=("undefined",))
    ctx, _ = context(scripted_stage, challenger(replies), "iteration.n_challenge=5", checker=checker)
    ctx.wh.insert_batch("questions", refs)
    report = challenge.run(ctx)

    got = generated(ctx)
    assert len(got) == 5 and report.info == {"rollouts": 5, "questions": 5}
    decided = {p: (q["text"], q["s_q"], q["admitted"], q["rejection_reason"], q["verifier_valid"], q["verifier_error"])
               for p, q in got.items()}
    assert decided == {
        "s0": ("", 0.0, False, "unparseable", False, "missing <question>; missing <answer>"),
        "s1": ("", 0.0, False, "unparseable", False, "empty completion"),
        "s2": ("How many legs do 3 cats have?", None, None, None, False, "no reference answer"),
        "s3": ("What is 5/0?", None, None, None, False, "reference answer does not parse"),
        "s4": (new_question(refs[4]["text"])[0], None, None, None, True, None)}
    # the checker hears only about questions with text; an output without one is never checked
    asked = {gold for batch in checker.asked for gold, _ in batch}
    assert asked - {""} == {"undefined", new_question(refs[4]["text"])[1]}
    formats = {r["question_id"]: r["format_reward"]
               for r in ctx.wh.rows("SELECT question_id, format_reward FROM rollouts")}
    assert formats == {"s0": 0.0, "s1": 0.5, "s2": 0.0, "s3": 1.0, "s4": 1.0}


def test_a_rerun_generates_and_writes_nothing(scripted_stage):
    ctx, llm = context(scripted_stage, challenger())
    ctx.wh.insert_batch("questions", seeds(6))
    first = challenge.run(ctx)
    before, calls = snapshot(ctx), list(llm.calls)
    again = challenge.run(ctx)
    assert first.rows_out == 8 and again.rows_out == 0 and again.info == {"rollouts": 0, "questions": 0}
    assert llm.calls == calls and snapshot(ctx) == before


def test_lost_rows_are_rewritten_as_they_were_without_asking_for_more(scripted_stage):
    ctx, llm = context(scripted_stage, challenger())
    ctx.wh.insert_batch("questions", seeds(6))
    challenge.run(ctx)
    before, requests = snapshot(ctx), len(llm.requests)
    # a crash after a batch of rollouts committed and before its questions did
    ctx.wh.execute("DELETE FROM questions WHERE origin = 'generated'")
    report = challenge.run(ctx)
    assert report.info == {"rollouts": 0, "questions": 4} and len(llm.requests) == requests
    assert snapshot(ctx) == before
    # a lost rollout is generated again, alone, with the seed it had: the same row comes back
    lost = before[0][0]
    ctx.wh.execute("DELETE FROM rollouts WHERE rollout_id = ?", [lost["rollout_id"]])
    ctx.wh.execute("DELETE FROM questions WHERE rollout_id = ?", [lost["rollout_id"]])
    report = challenge.run(ctx)
    assert report.info == {"rollouts": 1, "questions": 1} and llm.calls[-1] == 1
    assert llm.requests[-1].seed == lost["seed"] and snapshot(ctx) == before


def test_references_and_seeds_derive_from_the_run_seed_run_and_iteration(scripted_stage):
    def drawn(*overrides: str, iteration: int = 1):
        ctx, llm = context(scripted_stage, challenger(), "iteration.n_challenge=3", *overrides, iteration=iteration)
        ctx.wh.insert_batch("questions", seeds(8))
        challenge.run(ctx)
        rows = ctx.wh.rows("SELECT question_id, seed FROM rollouts ORDER BY question_id")
        for r in rows:   # the request seed is a hash of the unit's id and the run seed, stored with the rollout
            unit = Unit("challenger_math", r["question_id"], "math", {})
            assert r["seed"] == seed_from_id(content_id(ctx.cfg.run.seed, unit.unit_id(ctx, Purpose.CHALLENGE)))
        assert sorted(r.seed for r in llm.requests) == sorted(r["seed"] for r in rows)
        return rows

    first = drawn()
    assert len(first) == 3 and drawn() == first                   # a fresh warehouse draws the same references
    other_seed = drawn("run.seed=1")
    assert {r["seed"] for r in other_seed}.isdisjoint(r["seed"] for r in first)
    draws = {tuple(r["question_id"] for r in drawn(iteration=i)) for i in (1, 2, 3, 4)}
    assert len(draws) > 1                                          # each iteration draws its own


def test_generates_and_checks_in_whole_batches(scripted_stage):
    checker = ScriptedChecker()
    ctx, llm = context(scripted_stage, challenger(), "run.batch_rows=2", "iteration.n_challenge=5", checker=checker)
    ctx.wh.insert_batch("questions", seeds(5))
    report = challenge.run(ctx)
    assert llm.calls == [2, 2, 1] and [len(batch) for batch in checker.asked] == [2, 2, 1]
    assert report.info == {"rollouts": 5, "questions": 5}
