"""challenge (stages/challenge.py) on a ScriptedLLM, an in-memory warehouse and a scripted math checker: which
references it draws from the pool, the question rows it writes from the Challenger's output (unparseable and
invalid ones kept with their reason), re-runs, batches and sampling seeds.

Math references only: a code question's reference solution runs in the sandbox, a subprocess this tier never
starts; code questions are covered end to end in tests/flows. Grounded math labels (`iteration.math_labels:
program`, the default) run the Challenger's program in the sandbox too: here a scripted stand-in
(`ScriptedProgramSandbox`) runs the tests' own scripted programs in this process, so the label checks (each
failure reason, the agreement with the stated answer) run on known programs without a subprocess. The answer-only
form (`math_labels: answer`) must run nothing: its tests give the stage a sandbox that refuses any job."""

from __future__ import annotations

import re

import pytest

from sage.configs.names import Purpose, Role, Stage
from sage.engines.verify.sandbox import ExecResult
from sage.stages import admit, challenge
from sage.stages.prompts import TEMPLATE_VERSION
from sage.stages.rollouts import Unit
from sage.warehouse import content_id, norm_hash, seed_from_id
from tests.scripted import prompt_text
from tests.stages.pool import question, seeds

pytestmark = pytest.mark.fast

def new_question(reference: str) -> tuple[str, str, str]:
    """The (question, program, answer) the scripted Challenger writes for a reference: one more step with a new
    number, a program that computes the answer from exactly the numbers the question states (the sum of them all),
    and that answer."""
    question = f"{reference} Then add {len(reference)}."
    numbers = re.findall(r"\d+", question)
    return question, "def solve():\n    return " + " + ".join(numbers), str(sum(map(int, numbers)))


def grounded_reply(question: str, program: str, answer: str) -> str:
    return (f"<question>{question}</question>\n<solution>\n```python\n{program}\n```\n</solution>\n"
            f"<answer>{answer}</answer>")


def reference_of(req) -> str:
    return prompt_text(req).split("Reference problem:\n", 1)[1].split("\n\n", 1)[0]


def challenger(replies: dict[str, str] | None = None, answer_only: bool = False):
    """The Challenger's reply to each reference: `replies[reference]`, else a well-formed new question (grounded,
    or in the answer-only form)."""
    def script(req):
        reference = reference_of(req)
        if replies and reference in replies:
            return replies[reference]
        q, program, a = new_question(reference)
        return f"<question>{q}</question>\n<answer>{a}</answer>" if answer_only else grounded_reply(q, program, a)
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
    """The sandbox's interface for answer-only math batches: it must never be given a job."""

    def execute(self, jobs: list) -> list:
        assert not jobs, "an answer-only math batch ran code"
        return []


class ScriptedProgramSandbox:
    """A SCRIPTED STAND-IN for the sandbox (engines/verify/sandbox.py), for these fast unit tests only: it runs
    each job's code in this process with `exec` (no isolation, no limits, no subprocess) and returns
    `ExecResult`s as the sandbox does: status `ok`, or `error` with the exception. The code it runs is the tests'
    own scripted programs plus the stage's `_sage_label_` wrapper, never model output. Records every batch."""

    def __init__(self):
        self.batches: list[list] = []

    def execute(self, jobs: list) -> list[ExecResult]:
        self.batches.append(list(jobs))
        return [self._run(job) for job in jobs]

    @staticmethod
    def _run(job) -> ExecResult:
        outputs, errors = [], []
        for args in job.inputs:
            try:
                namespace: dict = {"__name__": "__scripted__"}
                exec(compile(job.code, "<scripted program>", "exec"), namespace)
                outputs.append(namespace[job.entry_point](*args))
                errors.append(None)
            except Exception as e:   # what the child reports for a failing input
                outputs.append(None)
                errors.append(f"{type(e).__name__}: {e}")
        status = "ok" if all(e is None for e in errors) else "error"
        return ExecResult(outputs, errors, status, "scripted", 0.0)


def verifier(answer: str | None, program: str | None, result: str | None, label: str = "grounded",
             agrees: bool | None = True, label_answer: str | None = None) -> dict:
    """A grounded math question's verifier: the label (`answer`: the stated answer, or the program's result under
    `math_labels: program`), how it was checked, the stated answer, the program, its result, and whether the two
    agree."""
    return {"answer": label_answer if label_answer is not None else answer, "label": label, "stated_answer": answer,
            "program": program, "program_result": result, "answer_agrees": agrees}


def context(scripted_stage, script, *overrides: str, iteration: int = 1, checker: ScriptedChecker | None = None,
            sandbox=None):
    answer_only = "iteration.math_labels=answer" in overrides
    return scripted_stage(script, "iteration.domains=[math]", *overrides, iteration=iteration,
                          mathcheck=checker or ScriptedChecker(),
                          sandbox=sandbox or (NoCodeSandbox() if answer_only else ScriptedProgramSandbox()))


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
        text, program, answer = new_question(texts[r["question_id"]])
        assert q["question_id"] == content_id("question", "generated", r["rollout_id"])
        # the label is grounded: the program ran, and its result is the stated answer
        assert (q["rollout_id"], q["text"], q["verifier"], q["norm_hash"], q["domain"], q["source"]) == \
            (r["rollout_id"], text, verifier(answer, program, answer), norm_hash(text), "math", "challenger")
        assert (q["run_id"], q["iteration"], q["verifier_valid"], q["verifier_error"]) == ("r", 2, True, None)
        assert (q["s_q"], q["admitted"], q["rejection_reason"]) == (None, None, None)  # critique and admit decide
        assert r["parsed"] == {"question": text, "answer": answer, "program": program} and r["format_reward"] == 1.0
    # the checker compares each program's result with its stated answer
    assert sorted(p for batch in checker.asked for p in batch) == sorted((q["verifier"]["answer"],) * 2
                                                                         for q in got.values())
    assert report.rows_in == 5 and report.rows_out == 10
    assert report.info == {"rollouts": 5, "questions": 5, "grounded": 5}
    assert llm.calls == [5]


def test_unparseable_and_invalid_outputs_are_kept_with_their_reason(scripted_stage):
    refs = seeds(5)
    replies = {refs[0]["text"]: "I cannot think of one.",
               refs[1]["text"]: "",
               refs[2]["text"]: "<question>How many legs do 3 cats have?</question>",
               refs[3]["text"]: grounded_reply("What is 5/0?", "def solve():\n    return 5 / 0", "undefined")}
    checker = ScriptedChecker(broken=("undefined",))
    ctx, _ = context(scripted_stage, challenger(replies), "iteration.n_challenge=5", checker=checker)
    ctx.wh.insert_batch("questions", refs)
    report = challenge.run(ctx)

    got = generated(ctx)
    assert len(got) == 5 and report.info == {"rollouts": 5, "questions": 5, "grounded": 1}
    decided = {p: (q["text"], q["s_q"], q["admitted"], q["rejection_reason"], q["verifier_valid"], q["verifier_error"],
                   q["verifier"]["label"])
               for p, q in got.items()}
    assert decided == {
        "s0": ("", 0.0, False, "unparseable", False, "missing <question>; missing <solution>; missing <answer>",
               None),
        "s1": ("", 0.0, False, "unparseable", False, "empty completion", None),
        # cpu.yaml's `math_labels: program`: a question without a program has no label
        "s2": ("How many legs do 3 cats have?", None, None, None, False, "no program computes the answer",
               "no_program"),
        "s3": ("What is 5/0?", None, None, None, False,
               "the program failed, returned no number or was nondeterministic", "program_failed"),
        "s4": (new_question(refs[4]["text"])[0], None, None, None, True, None, "grounded")}
    # the checker hears only about programs that ran; an output without a question is never checked
    asked = [pair for batch in checker.asked for pair in batch]
    assert asked == [(new_question(refs[4]["text"])[2],) * 2]
    formats = {r["question_id"]: r["format_reward"]
               for r in ctx.wh.rows("SELECT question_id, format_reward FROM rollouts")}
    assert formats == {"s0": 0.0, "s1": 0.5, "s2": 0.0, "s3": 1.0, "s4": 1.0}


def test_a_rerun_generates_and_writes_nothing(scripted_stage):
    ctx, llm = context(scripted_stage, challenger())
    ctx.wh.insert_batch("questions", seeds(6))
    first = challenge.run(ctx)
    before, calls = snapshot(ctx), list(llm.calls)
    again = challenge.run(ctx)
    assert first.rows_out == 8 and again.rows_out == 0
    assert again.info == {"rollouts": 0, "questions": 0, "grounded": 0}
    assert llm.calls == calls and snapshot(ctx) == before


def test_lost_rows_are_rewritten_as_they_were_without_asking_for_more(scripted_stage):
    ctx, llm = context(scripted_stage, challenger())
    ctx.wh.insert_batch("questions", seeds(6))
    challenge.run(ctx)
    before, requests = snapshot(ctx), len(llm.requests)
    # a crash after a batch of rollouts committed and before its questions did
    ctx.wh.execute("DELETE FROM questions WHERE origin = 'generated'")
    report = challenge.run(ctx)
    assert report.info == {"rollouts": 0, "questions": 4, "grounded": 4} and len(llm.requests) == requests
    assert snapshot(ctx) == before
    # a lost rollout is generated again, alone, with the seed it had: the same row comes back
    lost = before[0][0]
    ctx.wh.execute("DELETE FROM rollouts WHERE rollout_id = ?", [lost["rollout_id"]])
    ctx.wh.execute("DELETE FROM questions WHERE rollout_id = ?", [lost["rollout_id"]])
    report = challenge.run(ctx)
    assert report.info == {"rollouts": 1, "questions": 1, "grounded": 1} and llm.calls[-1] == 1
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
    checker, sandbox = ScriptedChecker(), ScriptedProgramSandbox()
    ctx, llm = context(scripted_stage, challenger(), "run.batch_rows=2", "iteration.n_challenge=5", checker=checker,
                       sandbox=sandbox)
    ctx.wh.insert_batch("questions", seeds(5))
    report = challenge.run(ctx)
    assert llm.calls == [2, 2, 1] and [len(batch) for batch in checker.asked] == [2, 2, 1]
    assert [len(batch) for batch in sandbox.batches] == [4, 4, 2]      # each program runs twice
    assert report.info == {"rollouts": 5, "questions": 5, "grounded": 5}


# ---------------------------------------------------------------------------------------------- grounded labels
REF = "What is 2+2?"
Q = "A box holds 12 apples and 7 pears. How many fruits in total?"


def one(scripted_stage, reply: str, mode: str, checker: ScriptedChecker | None = None, sandbox=None):
    """The question row the stage writes from one Challenger `reply` to REF under `math_labels: mode`, and the
    stage's report."""
    ctx, _ = context(scripted_stage, lambda req: reply, "iteration.n_challenge=1", f"iteration.math_labels={mode}",
                     checker=checker, sandbox=sandbox)
    ctx.wh.insert_batch("questions", [question("ref", REF)])
    report = challenge.run(ctx)
    (row,) = generated(ctx).values()
    return row, report


@pytest.mark.parametrize("mode", ["agreement", "program"])
def test_a_grounded_label_runs_its_program_twice_and_keeps_its_result(scripted_stage, mode):
    sandbox, checker = ScriptedProgramSandbox(), ScriptedChecker()
    program = "def solve():\n    apples, pears = 12, 7\n    return apples + pears"
    row, report = one(scripted_stage, grounded_reply(Q, program, "19"), mode, checker, sandbox)
    assert row["verifier"] == verifier("19", program, "19")
    assert (row["verifier_valid"], row["verifier_error"], row["text"]) == (True, None, Q)
    assert report.info == {"rollouts": 1, "questions": 1, "grounded": 1}
    (batch,) = sandbox.batches
    assert len(batch) == 2 and batch[0] == batch[1]                        # two runs of one job, which must agree
    assert batch[0].code.startswith(program) and batch[0].entry_point == "_sage_label_" and batch[0].inputs == [[]]
    assert checker.asked == [[("19", "19")]]                              # (program result, stated answer)


@pytest.mark.parametrize("mode", ["agreement", "program"])
@pytest.mark.parametrize("name,program,answer,label,error", [
    ("no_program", None, "19", "no_program", "no program computes the answer"),
    ("extra_number", "def solve():\n    return 12 + 7 + 5", "24", "number_mismatch",
     "the program uses 5, which the question does not state"),
    ("missing_number", "def solve():\n    return 12 + 12", "24", "number_mismatch",
     "the program uses 12, which the question does not state; the question states 7, which the program does not "
     "use"),
    ("raises", "def solve():\n    a, b = 12, 7\n    return a + b + [][a]", "19", "program_failed",
     "the program failed, returned no number or was nondeterministic"),
    ("returns_none", "def solve():\n    x = 12 + 7", "19", "program_failed",
     "the program failed, returned no number or was nondeterministic"),
    ("returns_bool", "def solve():\n    return bool(12 + 7)", "19", "program_failed",
     "the program failed, returned no number or was nondeterministic"),
    ("nondeterministic", "def solve():\n    import random\n    return 12 + 7 + random.random()", "19", "program_failed",
     "the program failed, returned no number or was nondeterministic"),
    ("syntax_error", "def solve():\n    return 12 +", "19", "program_failed",
     "the program failed, returned no number or was nondeterministic"),
])
def test_each_ungrounded_label_keeps_its_own_reason(scripted_stage, mode, name, program, answer, label, error):
    if mode == "program" and name == "nondeterministic":  # the program alone is the witness: its calls are checked
        label, error = "operation_mismatch", "the question names no random(), which the program uses"
    if program is None:   # the answer-only form, held to the grounded format
        reply = f"<question>{Q}</question>\n<answer>{answer}</answer>"
    else:
        reply = grounded_reply(Q, program, answer)
    row, report = one(scripted_stage, reply, mode)
    assert (row["verifier_valid"], row["verifier"]["label"], row["verifier_error"]) == (False, label, error)
    assert row["verifier"]["stated_answer"] == answer and row["verifier"]["program_result"] is None
    assert (row["s_q"], row["admitted"], row["rejection_reason"]) == (None, None, None)   # admit decides
    assert report.info["grounded"] == 0
    # and admission keeps this very reason (admit.LABEL_FAILURES must name every label the stage writes)
    assert admit.decide({**row, "s_q": 0.9}, 0.7, set()) == label


@pytest.mark.parametrize("mode", ["agreement", "program"])
def test_a_program_that_contradicts_its_questions_written_arithmetic_is_an_arithmetic_mismatch(scripted_stage, mode):
    """The audit's one wrong math label: `y + 1 = 3` grounded by `return 3 + 1` (same numbers, a `+` the question
    names, and a stated answer that agrees with the program)."""
    q = "Find the value of y: y + 12 = 19"
    row, report = one(scripted_stage, grounded_reply(q, "def solve():\n    return 19 + 12", "31"), mode)
    assert (row["verifier_valid"], row["verifier"]["label"]) == (False, "arithmetic_mismatch")
    assert row["verifier_error"] == "the question's own arithmetic `y + 12 = 19` gives 7; the program returns 31"
    assert row["verifier"]["program_result"] == "31" and report.info["grounded"] == 0
    assert admit.decide({**row, "s_q": 0.9}, 0.7, set()) == "arithmetic_mismatch"
    row, _ = one(scripted_stage, grounded_reply(q, "def solve():\n    return 19 - 12", "7"), mode)
    assert (row["verifier_valid"], row["verifier"]["label"], row["verifier"]["answer"]) == (True, "grounded", "7")


def test_a_stated_answer_the_program_contradicts_is_a_label_mismatch_under_agreement(scripted_stage):
    program = "def solve():\n    return 12 + 7"
    row, _ = one(scripted_stage, grounded_reply(Q, program, "20"), "agreement")
    assert row["verifier"] == verifier("20", program, "19", label="label_mismatch", agrees=False)
    assert (row["verifier_valid"], row["verifier_error"]) == (
        False, "the stated answer does not equal the program's result 19")


def test_under_program_the_programs_result_is_the_label_whatever_the_stated_answer(scripted_stage):
    program = "def solve():\n    return 12 + 7"
    row, _ = one(scripted_stage, grounded_reply(Q, program, "20"), "program")
    assert row["verifier"] == verifier("20", program, "19", agrees=False, label_answer="19")
    assert (row["verifier_valid"], row["verifier_error"]) == (True, None)
    # a question with a program and no stated answer is grounded by its program alone
    reply = f"<question>{Q}</question>\n<solution>\n```python\n{program}\n```\n</solution>"
    row, _ = one(scripted_stage, reply, "program")
    assert row["verifier"] == verifier(None, program, "19", agrees=False, label_answer="19")
    assert row["verifier_valid"]


def test_under_agreement_a_missing_answer_is_no_answer(scripted_stage):
    sandbox = ScriptedProgramSandbox()
    reply = f"<question>{Q}</question>\n<solution>\n```python\ndef solve():\n    return 12 + 7\n```\n</solution>"
    row, _ = one(scripted_stage, reply, "agreement", sandbox=sandbox)
    assert (row["verifier_valid"], row["verifier"]["label"], row["verifier_error"]) == (
        False, "no_answer", "no reference answer")
    assert sandbox.batches in ([], [[]])                                   # nothing ran


def test_a_fraction_result_is_written_as_its_text(scripted_stage):
    q = "Share 3 cakes among 4 children. How much cake does each child get?"
    program = "def solve():\n    from fractions import Fraction\n    return Fraction(3, 4)"
    row, _ = one(scripted_stage, grounded_reply(q, program, "3/4"), "agreement")
    assert (row["verifier"]["program_result"], row["verifier"]["label"]) == ("3/4", "grounded")
    whole = "def solve():\n    from fractions import Fraction\n    return Fraction(12, 4)"
    row, _ = one(scripted_stage, grounded_reply("Share 12 cakes among 4 children.", whole, "3"), "agreement")
    assert (row["verifier"]["program_result"], row["verifier"]["label"]) == ("3", "grounded")   # not "3/1"


def test_answer_mode_keeps_the_answer_only_prompt_and_format(scripted_stage):
    checker = ScriptedChecker()
    ctx, llm = context(scripted_stage, challenger(answer_only=True), "iteration.n_challenge=3",
                       "iteration.math_labels=answer", checker=checker)   # NoCodeSandbox: nothing may run
    ctx.wh.insert_batch("questions", seeds(3))
    report = challenge.run(ctx)
    assert report.info == {"rollouts": 3, "questions": 3}                  # no `grounded` count
    task = prompt_text(llm.requests[0])
    assert "<solution>" not in task and "<question>" in task and "<answer>" in task
    assert all("solve()" not in m["content"] for m in llm.requests[0].messages)
    rollouts = ctx.wh.records("SELECT * FROM rollouts")
    assert {r["template"] for r in rollouts} == {TEMPLATE_VERSION["challenger_math_answer"]}
    assert all(r["format_reward"] == 1.0 and r["parsed"]["program"] is None for r in rollouts)
    texts = {r["question_id"]: r["text"] for r in ctx.wh.rows("SELECT question_id, text FROM questions")}
    for parent, q in generated(ctx).items():
        text, _, answer = new_question(texts[parent])
        assert (q["text"], q["verifier"], q["verifier_valid"]) == (text, {"answer": answer, "label": "answer_only"},
                                                                  True)
    assert sorted(p for batch in checker.asked for p in batch) == sorted((a, a) for a in
                                                                          (new_question(t)[2] for t in
                                                                           [texts[p] for p in generated(ctx)]))


def test_answer_mode_labels_a_missing_answer(scripted_stage):
    row, _ = one(scripted_stage, f"<question>{Q}</question>", "answer", sandbox=NoCodeSandbox())
    assert (row["verifier"], row["verifier_valid"], row["verifier_error"]) == (
        {"answer": None, "label": "no_answer"}, False, "no reference answer")


def test_the_references_family_picks_the_worked_example_and_is_inherited(scripted_stage):
    gcd = "Find the Greatest Common Divisor (GCD) of these numbers: 8, 12. Give only the GCD as your final answer."
    new = "Find the Greatest Common Divisor (GCD) of these numbers: 18, 30. Give only the GCD as your final answer."
    reply = grounded_reply(new, "def solve():\n    import math\n    return math.gcd(18, 30)", "6")
    ctx, llm = context(scripted_stage, lambda req: reply, "iteration.n_challenge=1")
    ctx.wh.insert_batch("questions", [question("ref", gcd, source="reasoning_gym:gcd")])
    challenge.run(ctx)
    example_task, example_reply = llm.requests[0].messages[1]["content"], llm.requests[0].messages[2]["content"]
    assert "Greatest Common Divisor" in example_task and "math.gcd(24, 36)" in example_reply
    (row,) = generated(ctx).values()
    assert (row["source"], row["verifier"]["label"], row["verifier"]["program_result"]) == (
        "reasoning_gym:gcd", "grounded", "6")
    # a reference without a family gets the default example, and its question the source `challenger`
    ctx2, llm2 = context(scripted_stage, challenger(), "iteration.n_challenge=1")
    ctx2.wh.insert_batch("questions", [question("ref", REF)])
    challenge.run(ctx2)
    assert "Greatest Common Divisor" not in llm2.requests[0].messages[2]["content"]
    assert [q["source"] for q in generated(ctx2).values()] == ["challenger"]


def test_a_generated_reference_passes_its_family_on(scripted_stage):
    ctx, llm = context(scripted_stage, challenger(), "iteration.n_challenge=1", iteration=2)
    ctx.wh.insert_batch("questions", [
        question("g1", "Find the GCD of 14 and 21.", "generated", run_id="r", iteration=1, admitted=True,
                 admitted_iteration=1, source="reasoning_gym:gcd")])
    challenge.run(ctx)
    assert "math.gcd(24, 36)" in llm.requests[0].messages[2]["content"]
    assert [q["source"] for q in generated(ctx).values()] == ["reasoning_gym:gcd"]


@pytest.mark.parametrize("inputs,valid", [("[2, 3]\n[4, 5]", False), ("[2, 3]\n[2, 3]\n[4, 5]", False),
                                          ("[2, 3]\n[4, 5]\n[1, 7]", True)])
def test_a_code_question_needs_three_distinct_test_inputs(scripted_stage, inputs, valid):
    """One or two outputs of a solution nobody checked do not specify a task: the audit found every admitted code
    question with one input ill-posed or wrongly solved. Fewer than MIN_CODE_TESTS distinct inputs never reach the
    sandbox."""
    reply = ("<question>Write mul(a, b) returning a * b.</question>\n<signature>def mul(a, b)</signature>\n"
             "<solution>\n```python\ndef mul(a, b):\n    return a * b\n```\n</solution>\n"
             f"<inputs>\n{inputs}\n</inputs>")
    sandbox = ScriptedProgramSandbox()
    ctx, _ = scripted_stage(lambda req: reply, "iteration.domains=[code]", "iteration.n_challenge=1",
                            mathcheck=ScriptedChecker(), sandbox=sandbox)
    ctx.wh.insert_batch("questions", [question("ref", "Write add(a, b).", domain="code")])
    challenge.run(ctx)
    (row,) = generated(ctx).values()
    assert row["verifier_valid"] is valid and challenge.MIN_CODE_TESTS == 3
    if valid:
        assert row["verifier"]["outputs"] == [6, 20, 7] and len(sandbox.batches) == 1
    else:
        assert row["verifier_error"] == "no reference solution or fewer than 3 distinct test inputs"
        assert sandbox.batches == [] or all(not b for b in sandbox.batches)


def test_a_float_result_is_the_label_a_person_would_write(scripted_stage):
    program = "def solve():\n    return 1.99 + 1.19"
    row, _ = one(scripted_stage, grounded_reply("What is 1.99 + 1.19?", program, "3.18"), "program",
                 sandbox=ScriptedProgramSandbox())
    assert row["verifier"]["program_result"] == "3.18" and row["verifier"]["answer"] == "3.18"


@pytest.mark.parametrize("expression,label", [("16 / 3", "16/3"), ("1 / 100", "0.01"), ("7 / 2", "3.5"),
                                              ("-2 / 3", "-2/3"), ("2 ** 0.5", "1.41421356237")])
def test_a_ratio_whose_decimals_never_end_is_labelled_exactly(scripted_stage, expression, label):
    """Lever 15's audit found "16 / 3" admitted with the label 5.33333333333, what the float printed: a Solver that
    rounds otherwise is marked wrong. A ratio of small numbers is written as the fraction it is; a decimal that ends,
    or an irrational value, as before."""
    question_text = f"What is {expression}?"
    row, _ = one(scripted_stage, grounded_reply(question_text, f"def solve():\n    return {expression}", label),
                 "program", sandbox=ScriptedProgramSandbox())
    assert row["verifier"]["program_result"] == label


def test_a_question_that_copies_the_instructions_is_unparseable(scripted_stage):
    """The audit found admitted questions carrying the prompt's own "Write ONE new math problem of the same kind
    ..." after the problem; the copy is rejected before the Critic sees it, whatever its label."""
    question_text = ("State the final answer to the following arithmetic problem: 15 - 12 =\n\nWrite ONE new math "
                     "problem of the same kind and form as the reference")
    row, _ = one(scripted_stage, grounded_reply(question_text, "def solve():\n    return 15 - 12", "3"), "program",
                 sandbox=ScriptedProgramSandbox())
    assert (row["s_q"], row["admitted"], row["rejection_reason"], row["verifier_valid"]) == (0.0, False, "unparseable",
                                                                                             False)
    assert row["verifier_error"] == "the question copies the Challenger's instructions"
    assert not challenge.copies_instructions("State the final answer to the following arithmetic problem: 15 - 12 =",
                                             "challenger_math")
