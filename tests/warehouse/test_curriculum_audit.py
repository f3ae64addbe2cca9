"""The curriculum audit views (migration 009) on a warehouse built by hand: `probe_answers` (the probes' modal
answer, its share, whether it matches the label; ties go to the smaller text), `curriculum_audit` (`suspect_label`,
`copy_of_batch`) and `curriculum_drift`'s `grounded`, `rejected_ungrounded` and `copy_share`."""

from __future__ import annotations

import pytest

from sage.warehouse import Warehouse
from sage.warehouse.report_queries import admitted_questions
from tests.stages.pool import question

pytestmark = pytest.mark.fast

RUN = "audit"


def grounded(answer: str, program: str) -> dict:
    return {"answer": answer, "label": "grounded", "program": f"def solve():\n    return {program}",
            "program_result": answer, "stated_answer": answer, "answer_agrees": True}


def generated(qid: str, text: str, iteration: int, verifier: dict, reason: str | None, near_of: str | None,
              near_sim: float | None, s_q: float = 0.9, difficulty: float | None = 0.5) -> dict:
    admitted = reason is None
    row = question(qid, text, origin="generated", run_id=RUN, iteration=iteration,
                   source="reasoning_gym:basic_arithmetic", parent_id="s0", rollout_id=f"c-{qid}", s_q=s_q,
                   difficulty=difficulty, verifier_valid=verifier.get("label") == "grounded", admitted=admitted,
                   admitted_iteration=iteration if admitted else None, rejection_reason=reason,
                   near_dup_similarity=near_sim, near_dup_of=near_of)
    return {**row, "verifier": verifier}


# iteration 1, in the order the Challenger wrote them; the label is the program's result
QUESTIONS = [
    # admitted; its probes mostly say 8 against the label 7: a suspect label
    generated("g1", "What is 3+4?", 1, grounded("7", "3 + 4"), None, "s0", 0.3),
    # a copy of g1 from the same batch (>= 0.8): rejected as near-duplicate although its label is grounded
    generated("g2", "What is 3+4 now?", 1, grounded("7", "3 + 4"), "near_duplicate", "g1", 0.875),
    # the program's numbers are not the question's: ungrounded; its probes agree against the label, but it was
    # not admitted, so no suspect label
    generated("g3", "Add 5 and 6.", 1, {"answer": "12", "label": "number_mismatch",
                                        "program": "def solve():\n    return 5 + 7"},
              "number_mismatch", "g1", 0.2),
    # admitted; probes split 12 / 5: the tie goes to the smaller text "12", which is the label
    generated("g4", "What is 6 times 2?", 1, grounded("12", "6 * 2"), None, "g1", 0.1),
    # admitted; probes split 9 / 10: the tie goes to "10" (smaller text), half the probes against the label
    generated("g5", "What is 4+5?", 1, grounded("9", "4 + 5"), None, "g1", 0.4),
    # admitted; three probes, three answers, none the label: the mode "1" holds a third, below half
    generated("g6", "What is 1+3?", 1, grounded("4", "1 + 3"), None, "g5", 0.4),
    # ungrounded (the question names no multiplication) and at exactly 0.8 of g2, a rejected question of this
    # batch: a copy all the same
    generated("g7", "What is 2 and 3 plus 1?", 1, {"answer": "7", "label": "operation_mismatch",
                                                   "program": "def solve():\n    return 2 * 3 + 1"},
              "operation_mismatch", "g2", 0.8),
    # iteration 2: a copy of an earlier iteration's question is a near-duplicate but not a copy of its batch, and
    # 0.79 to a question of its own batch is below the copy threshold
    generated("h1", "What is 3+4 now, then?", 2, grounded("7", "3 + 4"), "near_duplicate", "g1", 0.95),
    generated("h2", "What is 3+4 then?", 2, grounded("7", "3 + 4"), "low_quality", "h1", 0.79, s_q=0.1),
]

# question -> its probes' (final answer, s_gt); None: a verdict without a `pred` (read as the empty answer)
PROBES = {
    "g1": [("8", 0.0), ("8", 0.0), ("7", 1.0)],
    "g3": [("11", 0.0), ("11", 0.0)],
    "g4": [("12", 1.0), ("5", 0.0)],
    "g5": [("9", 1.0), ("10", 0.0)],
    "g6": [("1", 0.0), ("2", 0.0), ("3", 0.0)],
    "h1": [(None, 0.0), (None, 0.0), ("7", 1.0)],
}


def rollout(rid: str, qid: str, iteration: int, purpose: str, role: str, k: int) -> dict:
    return {"rollout_id": rid, "run_id": RUN, "iteration": iteration, "stage": purpose, "role": role,
            "purpose": purpose, "question_id": qid, "template": "v1", "prompt_text": "p", "completion_text": "c",
            "prompt_ids": [1, 2], "completion_ids": [3], "sample_index": k, "seed": k, "format_reward": 1.0}


def verdict(rid: str, iteration: int, pred: str | None, s_gt: float) -> dict:
    tests = {"gold": "x"} if pred is None else {"gold": "x", "pred": pred}
    return {"rollout_id": rid, "run_id": RUN, "iteration": iteration, "kind": "math", "s_gt": s_gt, "tests": tests}


@pytest.fixture(scope="module")
def wh():
    with Warehouse.open(":memory:") as wh:
        wh.insert_batch("runs", [{"run_id": RUN, "config": {}, "config_hash": "h", "base_model": "tiny", "seed": 1}])
        wh.insert_batch("iterations", [{"run_id": RUN, "iteration": k, "status": "done"} for k in (1, 2, 3)])
        wh.insert_batch("questions", [question("s0", "What is 2+2?", source="reasoning_gym:basic_arithmetic"),
                                      *QUESTIONS])
        it = {q["question_id"]: q["iteration"] for q in QUESTIONS}
        rollouts, verdicts = [], []
        for qid, probes in PROBES.items():
            for k, (pred, s_gt) in enumerate(probes):
                rid = f"p-{qid}-{k}"
                rollouts.append(rollout(rid, qid, it[qid], "probe", "solver", k))
                verdicts.append(verdict(rid, it[qid], pred, s_gt))
        # the Solver's answers after the probe are not probes: four right answers to g1 change nothing
        for k in range(4):
            rollouts.append(rollout(f"s-g1-{k}", "g1", 1, "solve", "solver", k))
            verdicts.append(verdict(f"s-g1-{k}", 1, "7", 1.0))
        assert wh.insert_batch("rollouts", rollouts) == len(rollouts)
        assert wh.insert_batch("verdicts", verdicts) == len(verdicts)
        yield wh


def by_question(wh: Warehouse, sql: str) -> dict[str, dict]:
    return {r.pop("question_id"): r for r in wh.rows(sql, [RUN])}


def test_probe_answers_mode_share_and_match(wh):
    rows = by_question(wh, "SELECT question_id, probes, probe_mode, probe_mode_share, probe_mode_matches_label "
                           "FROM probe_answers WHERE run_id = ?")
    assert set(rows) == set(PROBES)  # only probed questions; the solve rollouts of g1 are not probes
    got = {qid: (r["probes"], r["probe_mode"], r["probe_mode_share"], r["probe_mode_matches_label"])
           for qid, r in rows.items()}
    assert got == {
        "g1": (3, "8", pytest.approx(2 / 3), False),
        "g3": (2, "11", 1.0, False),
        "g4": (2, "12", 0.5, True),      # a tie: "12" < "5"
        "g5": (2, "10", 0.5, False),     # a tie: "10" < "9"
        "g6": (3, "1", pytest.approx(1 / 3), False),
        "h1": (3, "7", pytest.approx(1 / 3), True),  # probes without a final answer give none: the mode is "7"
    }


def test_curriculum_audit_suspect_label_and_copy_of_batch(wh):
    rows = by_question(wh, "SELECT question_id, iteration, family, label, label_check, program, program_result, "
                           "probes, admitted, rejection_reason, copy_of_batch, suspect_label, parent_text "
                           "FROM curriculum_audit WHERE run_id = ?")
    assert set(rows) == {q["question_id"] for q in QUESTIONS}  # generated questions only: no seed
    # suspect: admitted, more than half the probes on one answer, and that answer is not the label (g5's 1-1 split
    # between the label and another answer is not)
    assert {qid for qid, r in rows.items() if r["suspect_label"]} == {"g1"}
    assert all(r["suspect_label"] is False for qid, r in rows.items() if qid != "g1")  # never NULL
    # copy: the closest question (>= 0.8) was written earlier in the same iteration, admitted or not
    assert {qid for qid, r in rows.items() if r["copy_of_batch"]} == {"g2", "g7"}
    assert all(r["copy_of_batch"] is False for qid, r in rows.items() if qid not in ("g2", "g7"))
    g1, g3 = rows["g1"], rows["g3"]
    assert (g1["label"], g1["label_check"], g1["program_result"], g1["probes"]) == ("7", "grounded", "7", 3)
    assert g1["program"] == "def solve():\n    return 3 + 4" and g1["family"] == "reasoning_gym:basic_arithmetic"
    assert g1["parent_text"] == "What is 2+2?" and g1["iteration"] == 1
    assert (g3["label_check"], g3["program_result"], g3["admitted"]) == ("number_mismatch", None, False)
    assert rows["g2"]["probes"] is None  # never probed


def test_curriculum_drift_grounded_ungrounded_and_copy_share(wh):
    rows = {r["iteration"]: r for r in wh.rows(
        "SELECT iteration, generated, admitted, rejected, rejected_invalid_verifier, rejected_near_duplicate, "
        "rejected_low_quality, grounded, rejected_ungrounded, copy_share FROM curriculum_drift WHERE run_id = ? "
        "ORDER BY iteration", [RUN])}
    assert rows[1] == {"iteration": 1, "generated": 7, "admitted": 4, "rejected": 3, "rejected_invalid_verifier": 0,
                       "rejected_near_duplicate": 1, "rejected_low_quality": 0, "grounded": 5,
                       "rejected_ungrounded": 2, "copy_share": pytest.approx(2 / 7)}
    assert rows[2] == {"iteration": 2, "generated": 2, "admitted": 0, "rejected": 2, "rejected_invalid_verifier": 0,
                       "rejected_near_duplicate": 1, "rejected_low_quality": 1, "grounded": 2,
                       "rejected_ungrounded": 0, "copy_share": 0.0}
    # an iteration that generated nothing: zero counts, no share
    assert rows[3] == {"iteration": 3, "generated": 0, "admitted": 0, "rejected": 0, "rejected_invalid_verifier": 0,
                       "rejected_near_duplicate": 0, "rejected_low_quality": 0, "grounded": 0,
                       "rejected_ungrounded": 0, "copy_share": None}


def test_admitted_questions_report_table(wh):
    rows = admitted_questions(wh, RUN)
    assert [(r["iteration"], r["text"], r["label"], r["probe_mode"], r["suspect_label"]) for r in rows] == [
        (1, "What is 3+4?", "7", "8", True), (1, "What is 6 times 2?", "12", "12", False),
        (1, "What is 4+5?", "9", "10", False), (1, "What is 1+3?", "4", "1", False)]
    assert list(rows[0]) == ["iteration", "family", "text", "label", "label_check", "program_result", "probe_mode",
                             "probe_mode_share", "s_q", "difficulty", "suspect_label"]


def test_admission_frontier_gives_each_probed_questions_pass_rate_beside_the_band(wh):
    """`admission_frontier` (migration 017): per probed question its probes and pass rate (their mean s_gt), the
    run's admission rule and band (a config without them: quality, 0.3-0.7) and whether p is in the band."""
    rows = by_question(wh, "SELECT question_id, probes, pass_rate, admission, band_low, band_high, in_band, admitted "
                           "FROM admission_frontier WHERE run_id = ?")
    assert {q: (r["probes"], r["pass_rate"], r["in_band"]) for q, r in rows.items()} == {
        "g1": (3, pytest.approx(1 / 3), True), "g3": (2, 0.0, False), "g4": (2, 0.5, True), "g5": (2, 0.5, True),
        "g6": (3, 0.0, False), "h1": (3, pytest.approx(1 / 3), True)}
    assert {(r["admission"], r["band_low"], r["band_high"]) for r in rows.values()} == {("quality", 0.3, 0.7)}
    assert rows["g1"]["admitted"] and not rows["g3"]["admitted"]


def test_solver_curriculum_counts_the_answers_to_generated_questions(wh):
    """`solver_curriculum`: g1's four training answers are all to a generated question; probes are not counted; a
    config without `generated_share` asked for none."""
    assert wh.rows("SELECT * FROM solver_curriculum WHERE run_id = ?", [RUN]) == [
        {"run_id": RUN, "iteration": 1, "answers": 4, "generated_answers": 4, "generated_share": 1.0, "questions": 1,
         "generated_questions": 1, "generated_asked": 0}]
