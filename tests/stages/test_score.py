"""Reward formulas (SAGE.md, "Roles" and steps 4, 7, 9, 10) on hand-computed values, and TRR++."""

from __future__ import annotations

import math

import pytest

from sage.configs.schema import IterationConfig, RewardsConfig
from sage.engines.text.tags import parse_critic, parse_planner, parse_solver
from sage.stages.score import (
    REWARD_VERSION,
    challenger_reward,
    critic_reward,
    gate,
    planner_reward,
    score_id,
    solver_reward,
    trr_advantages,
    trr_group,
)
from sage.warehouse.ids import content_id

pytestmark = pytest.mark.fast

W = RewardsConfig()
ALPHA = IterationConfig().alpha      # 0.7
BETA = IterationConfig().beta        # 0.3


def test_challenger_earns_difficulty_when_admitted():
    r, c = challenger_reward(s_q=0.8, r_d=0.5, r_f=1.0, admitted=True)
    assert r == pytest.approx((0.8 + 0.5 + 1.0) / 3) == pytest.approx(0.766667, abs=1e-6)
    assert c == {"s_q": 0.8, "r_d": 0.5, "r_f": 1.0, "admitted": True, "suppressed": False}
    r, _ = challenger_reward(s_q=0.7, r_d=0.25, r_f=1.0, admitted=True)     # s_q == alpha was admitted
    assert r == pytest.approx(0.65)


def test_challenger_suppressed_unless_admitted():
    r, c = challenger_reward(s_q=0.6, r_d=0.9, r_f=1.0, admitted=False)
    assert r == pytest.approx(1.6 / 3) and c["suppressed"]       # (0.6 + 1.0) / 3: difficulty third withheld
    r, c = challenger_reward(s_q=0.9, r_d=1.0, r_f=0.5, admitted=False)
    assert r == pytest.approx(1.4 / 3) and c["suppressed"]       # (0.9 + 0.5) / 3: good and hard, but not admitted
    assert c == {"s_q": 0.9, "r_d": 1.0, "r_f": 0.5, "admitted": False, "suppressed": True}
    r, _ = challenger_reward(s_q=0.2, r_d=None, r_f=0.0, admitted=False)
    assert r == pytest.approx(0.2 / 3)                           # no probe needed when suppressed


def test_challenger_rejected_examples_of_the_issue_earn_less_than_admitted():
    # Critic 7 (s_q = 6/9, below alpha), format 1: rejected as low quality
    rejected, _ = challenger_reward(s_q=6 / 9, r_d=0.0, r_f=1.0, admitted=False)
    assert rejected == pytest.approx((6 / 9 + 1) / 3) == pytest.approx(0.555556, abs=1e-6)   # was 0.833 with / 2
    # Critic 7.x admitted (s_q = 7/9), every probe passes (r_d = 0): the least an admitted question earns with r_f 1
    admitted, _ = challenger_reward(s_q=7 / 9, r_d=0.0, r_f=1.0, admitted=True)
    assert admitted == pytest.approx(0.592593, abs=1e-6) and admitted > rejected
    # Critic 10 with a broken verifier: no longer the maximum 1.0
    broken, _ = challenger_reward(s_q=1.0, r_d=None, r_f=1.0, admitted=False)
    assert broken == pytest.approx(2 / 3)
    # Critic 10, a label no probe matches (r_d = 1) that was rejected (mismatched label, duplicate, ...): the
    # difficulty it "earned" by being wrong or copied is not paid
    wrong, _ = challenger_reward(s_q=1.0, r_d=1.0, r_f=1.0, admitted=False)
    assert wrong == pytest.approx(2 / 3)


GRID = sorted({i / 9 for i in range(10)} | {ALPHA, 0.0, 1.0})   # every Critic score 1..10, normalised, and alpha
FORMATS = [0.0, 0.5, 1.0]
DIFFICULTIES = [None, 0.0, 0.125, 1 / 3, 0.5, 0.875, 1.0]


@pytest.mark.parametrize("s_q", GRID)
@pytest.mark.parametrize("r_f", FORMATS)
@pytest.mark.parametrize("r_d", DIFFICULTIES)
def test_a_question_not_admitted_never_earns_the_difficulty_term(s_q, r_f, r_d):
    """Whatever its quality, difficulty and format, a rejected question is paid (s_q + r_f) / 3: r_d never
    enters, so no difficulty (1 included: a wrong label no Solver matches) moves its reward."""
    reward, c = challenger_reward(s_q, r_d, r_f, admitted=False)
    assert reward == pytest.approx((s_q + r_f) / 3)
    assert c["suppressed"] and not c["admitted"]
    for other in DIFFICULTIES:
        assert challenger_reward(s_q, other, r_f, admitted=False)[0] == reward


@pytest.mark.parametrize("s_q", GRID)
@pytest.mark.parametrize("r_f", FORMATS)
def test_for_equal_quality_and_format_admission_never_earns_less_than_rejection(s_q, r_f):
    """SAGE.md step 4: for the same s_q and r_f, an admitted question never earns less than a rejected one,
    whatever either's difficulty; the difference is exactly the difficulty third."""
    for r_d in DIFFICULTIES[1:]:
        admitted, c_adm = challenger_reward(s_q, r_d, r_f, admitted=True)
        assert not c_adm["suppressed"] and c_adm["admitted"]
        for rejected_r_d in DIFFICULTIES:
            rejected, _ = challenger_reward(s_q, rejected_r_d, r_f, admitted=False)
            assert admitted >= rejected, (s_q, r_d, r_f, rejected_r_d)
            assert admitted - rejected == pytest.approx(r_d / 3)


def test_an_admitted_question_needs_its_difficulty():
    with pytest.raises(ValueError, match="r_d"):
        challenger_reward(s_q=0.9, r_d=None, r_f=1.0, admitted=True)


def test_challenger_empty_completion_and_unparseable_score():
    r_f = parse_planner("").format_reward                        # any role: empty completion -> 0.5
    s_q = parse_critic("I cannot decide.").fields["score"]       # unparseable -> neutral 0.5
    assert (r_f, s_q) == (0.5, 0.5)
    r, c = challenger_reward(s_q=s_q, r_d=1.0, r_f=r_f, admitted=False)
    assert r == pytest.approx(1 / 3) and c["suppressed"]         # 0.5 < alpha, rejected: (0.5 + 0.5) / 3


def test_planner_reward():
    assert planner_reward(0.6, 1.0, W) == (pytest.approx(0.8), {"s_p": 0.6, "r_f": 1.0})
    s_p = parse_critic("<score>10</score>").fields["score"]      # 1.0
    assert planner_reward(s_p, parse_planner("").format_reward, W)[0] == pytest.approx(0.75)
    w = RewardsConfig(planner_critic=0.7, planner_format=0.3)
    assert planner_reward(0.5, 0.0, w)[0] == pytest.approx(0.35)


def test_solver_reward_with_plan_shown_and_withheld():
    s_p = parse_critic("Good plan. <score>8</score>").fields["score"]      # 7/9
    assert gate(s_p, BETA)
    r, c = solver_reward(s_p, s_gt=1.0, r_f=1.0, w=W)
    assert r == pytest.approx(0.2 * 7 / 9 + 0.6 + 0.2) and c == {"s_p_tilde": s_p, "s_gt": 1.0, "r_f": 1.0}
    s_p = parse_critic("<score>2</score>").fields["score"]                 # 1/9 < beta: withheld
    assert not gate(s_p, BETA)
    r, c = solver_reward(0.0, s_gt=1.0, r_f=1.0, w=W)
    assert r == pytest.approx(0.8) and c["s_p_tilde"] == 0.0
    r, _ = solver_reward(0.0, s_gt=0.5, r_f=parse_solver("", "code").format_reward, w=W)
    assert r == pytest.approx(0.6 * 0.5 + 0.2 * 0.5)                      # partial tests, empty output


def test_critic_reward_is_format_only():
    assert critic_reward(1.0) == (1.0, {"r_f": 1.0})
    assert critic_reward(parse_critic("").format_reward)[0] == 0.5
    assert critic_reward(parse_critic("<score>7</score><score>8</score>").format_reward)[0] == 0.5
    assert critic_reward(parse_critic("seven").format_reward)[0] == 0.0


def test_gate():
    assert gate(0.3, 0.3) and not gate(0.2999, 0.3) and gate(1.0, 0.3)


def test_trr_single_and_equal_groups_get_zero():
    assert trr_advantages([0.7], ["solver"], 1e-6) == [0.0]
    assert trr_advantages([0.4, 0.4, 0.4], ["critic"] * 3, 1e-6) == [0.0, 0.0, 0.0]
    assert trr_advantages([0.1 * 3, 0.3, 0.1 + 0.2], ["p"] * 3, 1e-6) == pytest.approx([0, 0, 0], abs=1e-9)
    assert trr_advantages([], [], 1e-6) == []


def test_trr_mixed_groups_hand_computed():
    # solver group {0.2, 0.4, 0.6, 0.8}: mean 0.5, population variance 0.05, std sqrt(0.05)
    rewards = [0.2, 0.9, 0.4, 0.6, 0.8, 0.5, 0.5]
    groups = ["solver", "challenger", "solver", "solver", "solver", "planner", "planner"]
    a = trr_advantages(rewards, groups, eps=1e-6)
    std = math.sqrt(0.05)
    expected = [-0.3 / (std + 1e-6), 0.0, -0.1 / (std + 1e-6), 0.1 / (std + 1e-6), 0.3 / (std + 1e-6), 0.0, 0.0]
    assert a == pytest.approx(expected, rel=1e-9)
    assert a[0] == pytest.approx(-1.341635, abs=1e-6)           # -3 / sqrt(5) = -1.341641, shrunk by eps
    a = trr_advantages([1.0, 0.0], ["g", "g"], eps=0.5)
    assert a == pytest.approx([0.5, -0.5])                       # (±0.5) / (0.5 + 0.5)


def test_trr_groups_and_errors():
    assert trr_group("solver", "code", "role") == "solver"
    assert trr_group("solver", "code", "role_domain") == "solver/code"
    with pytest.raises(ValueError):
        trr_group("solver", "code", "domain")
    with pytest.raises(ValueError, match="2 rewards but 1 groups"):
        trr_advantages([0.1, 0.2], ["a"], 1e-6)
    # role x domain splits what role alone would normalise together
    rewards, domains = [1.0, 0.0, 1.0, 1.0], ["math", "math", "code", "code"]
    by_domain = trr_advantages(rewards, [trr_group("solver", d, "role_domain") for d in domains], 1e-6)
    assert by_domain[2:] == [0.0, 0.0] and by_domain[0] == pytest.approx(1.0, abs=1e-5)
    by_role = trr_advantages(rewards, [trr_group("solver", d, "role") for d in domains], 1e-6)
    assert by_role[2] != 0.0


def test_score_id_hashes_the_reward_version():
    assert REWARD_VERSION == 3
    assert score_id("r1") == content_id("score", "r1", 3) == score_id("r1", 3)
    assert score_id("r1", 1) != score_id("r1") != score_id("r2")


def test_a_missing_verdict_is_refused_not_scored_as_wrong():
    from sage.stages.score import check_inputs

    answer = dict(rollout_id="r1", purpose="solve", s_gt=None)
    with pytest.raises(RuntimeError, match=r"1 Solver answer\(s\) of iteration 3 of run 'x' have no verdict \(r1\); "
                                           r"run `sage stage verify --run x --iteration 3` first"):
        check_inputs([answer, dict(rollout_id="r0", purpose="plan", s_gt=None)], "x", 3)
    with pytest.raises(RuntimeError, match="has no rollouts to score"):
        check_inputs([], "x", 3)
    check_inputs([{**answer, "s_gt": 0.0}, dict(rollout_id="r0", purpose="plan", s_gt=None)], "x", 3)  # scored


# ---------------------------------------------------------------------------------------------- the stage
def _challenge_rollout(rid: str) -> dict:
    return {"rollout_id": rid, "run_id": "r", "iteration": 1, "stage": "challenge", "role": "challenger",
            "purpose": "challenge", "question_id": "ref", "template": "v1", "prompt_text": "p",
            "completion_text": "c", "prompt_ids": [1], "completion_ids": [2], "sample_index": 0, "seed": 0,
            "format_reward": 1.0}


def _generated(rid: str, text: str, admitted: bool, reason: str | None, s_q: float = 1.0,
               difficulty: float | None = 1.0, valid: bool = True) -> dict:
    from sage.warehouse import norm_hash

    return dict(question_id=f"q-{rid}", origin="generated", domain="math", text=text, verifier={"answer": "1"},
                norm_hash=norm_hash(text), parent_id="ref", run_id="r", iteration=1, rollout_id=rid, s_q=s_q,
                difficulty=difficulty, verifier_valid=valid, admitted=admitted,
                admitted_iteration=1 if admitted else None, rejection_reason=reason)


# a Critic 10, format 1 question no probe solved (r_d = 1) under each admission outcome
OUTCOMES = {"admitted": (True, None, True), "duplicate": (False, "duplicate", True),
            "near_duplicate": (False, "near_duplicate", True), "contaminated": (False, "contaminated", True),
            "label_mismatch": (False, "label_mismatch", False), "low_quality": (False, "low_quality", True)}


def test_the_stage_pays_rejected_questions_the_suppressed_branch(scripted_stage):
    """A duplicate, near-duplicate or contaminated question has a valid verifier and s_q >= alpha (SAGE.md's
    condition for the difficulty third), yet was not admitted: the stage pays it (s_q + r_f) / 3."""
    from sage.stages import score
    from tests.stages.pool import question

    ctx, _ = scripted_stage(lambda req: "")
    ctx.wh.insert_batch("questions", [question("ref", "What is 2+2?")] + [
        _generated(name, f"What is {k} + {k}?", admitted, reason, valid=valid)
        for k, (name, (admitted, reason, valid)) in enumerate(OUTCOMES.items())])
    ctx.wh.insert_batch("rollouts", [_challenge_rollout(name) for name in OUTCOMES])
    report = score.run(ctx)
    assert report.rows_out == len(OUTCOMES)
    got = {r["rollout_id"]: r for r in ctx.wh.records("SELECT * FROM scores")}
    assert set(got) == set(OUTCOMES)
    assert all(r["reward_version"] == REWARD_VERSION and r["score_id"] == score_id(rid) for rid, r in got.items())
    assert got["admitted"]["reward"] == pytest.approx(1.0)
    assert got["admitted"]["components"] == {"s_q": 1.0, "r_d": 1.0, "r_f": 1.0, "admitted": True,
                                             "suppressed": False}
    for name in OUTCOMES.keys() - {"admitted"}:
        assert got[name]["reward"] == pytest.approx(2 / 3), name
        assert got[name]["components"] == {"s_q": 1.0, "r_d": 1.0, "r_f": 1.0, "admitted": False,
                                           "suppressed": True}, name


def test_the_stage_refuses_an_admitted_question_that_was_never_probed(scripted_stage):
    from sage.stages import score
    from tests.stages.pool import question

    ctx, _ = scripted_stage(lambda req: "")
    ctx.wh.insert_batch("questions", [question("ref", "What is 2+2?"),
                                      _generated("a", "What is 3 + 3?", True, None, difficulty=None),
                                      _generated("d", "What is 4 + 4?", False, "duplicate", difficulty=None)])
    ctx.wh.insert_batch("rollouts", [_challenge_rollout("a")])
    with pytest.raises(ValueError, match="r_d"):
        score.run(ctx)
    # a rejected question needs no probe
    ctx.wh.execute("DELETE FROM rollouts")
    ctx.wh.insert_batch("rollouts", [_challenge_rollout("d")])
    assert score.run(ctx).rows_out == 1


def test_an_answer_without_the_planner_is_scored_as_one_whose_plan_was_withheld(scripted_stage):
    """`iteration.planner` false leaves every solve rollout without a plan (`plan_id` NULL): its s~_p is 0, the
    Solver's reward has no plan term, exactly as for a plan the gate withheld; shown plans pay theirs."""
    from sage.stages import score
    from tests.stages.pool import question

    def answer(rid: str, plan_id: str | None) -> dict:
        return {**_challenge_rollout(rid), "stage": "solve", "role": "solver", "purpose": "solve", "plan_id": plan_id,
                "format_reward": 0.5}

    ctx, _ = scripted_stage(lambda req: "", "iteration.planner=false")
    ctx.wh.insert_batch("questions", [question("ref", "What is 2+2?")])
    ctx.wh.insert_batch("rollouts", [answer("none", None), answer("withheld", "p-low"), answer("shown", "p-high")])
    ctx.wh.insert_batch("plans", [dict(plan_id=p, run_id="r", iteration=1, question_id="ref", s_p=s_p,
                                       passed=s_p >= 0.3) for p, s_p in (("p-low", 0.1), ("p-high", 0.9))])
    ctx.wh.insert_batch("verdicts", [dict(rollout_id=rid, run_id="r", iteration=1, kind="math", s_gt=1.0)
                                     for rid in ("none", "withheld", "shown")])
    score.run(ctx)
    got = {r["rollout_id"]: r for r in ctx.wh.records("SELECT rollout_id, reward, components FROM scores")}
    assert got["none"]["components"] == got["withheld"]["components"] == {"s_p_tilde": 0.0, "s_gt": 1.0, "r_f": 0.5}
    assert got["none"]["reward"] == got["withheld"]["reward"] == pytest.approx(0.6 * 1.0 + 0.2 * 0.5)
    assert got["shown"]["reward"] == pytest.approx(0.2 * 0.9 + 0.6 * 1.0 + 0.2 * 0.5)


def test_uncertainty_pays_most_at_half_and_less_for_repeating_the_batch():
    from sage.stages.score import uncertainty

    # p = 1 - r_d: 0.5 pays 1, 0 and 1 pay nothing, 0.25 and 0.75 pay a half
    assert [uncertainty(r_d, 0.0, 1.0) for r_d in (0.5, 0.0, 1.0, 0.25, 0.75)] == [1.0, 0.0, 0.0, 0.5, 0.5]
    assert uncertainty(0.5, 0.25, 1.0) == 0.75 and uncertainty(0.5, 0.25, 2.0) == 0.5
    assert uncertainty(0.25, 0.75, 1.0) == 0.0                   # never below 0 (R-Zero's max(0, .))
    assert uncertainty(0.5, None, 1.0) == 1.0 and uncertainty(None, 0.5, 1.0) is None


def test_the_stage_pays_the_uncertainty_term_when_configured(scripted_stage):
    """`rewards.challenger_difficulty` uncertainty: an admitted question answered right half the time earns
    (s_q + 1 - repetition + r_f) / 3 where the paper's term pays it (s_q + 0.5 + r_f) / 3; one nobody solves earns
    nothing for difficulty; a rejected one stays suppressed."""
    from sage.stages import score
    from tests.stages.pool import question

    def scored(*overrides: str) -> dict[str, dict]:
        ctx, _ = scripted_stage(lambda req: "", *overrides)
        ctx.wh.insert_batch("questions", [question("ref", "What is 2+2?")] + [
            {**_generated("half", "What is 3 + 3?", True, None, difficulty=0.5), "batch_repetition": 0.25},
            _generated("hard", "What is 4 + 4?", True, None, difficulty=1.0),
            _generated("dup", "What is 5 + 5?", False, "duplicate", difficulty=0.5)])
        ctx.wh.insert_batch("rollouts", [_challenge_rollout(name) for name in ("half", "hard", "dup")])
        score.run(ctx)
        return {r["rollout_id"]: r for r in ctx.wh.records("SELECT * FROM scores")}

    paper, frontier = scored(), scored("rewards.challenger_difficulty=uncertainty")
    assert paper["half"]["reward"] == pytest.approx(2.5 / 3) and paper["hard"]["reward"] == pytest.approx(1.0)
    assert frontier["half"]["reward"] == pytest.approx(2.75 / 3) and frontier["hard"]["reward"] == pytest.approx(2 / 3)
    assert frontier["half"]["components"] == {"s_q": 1.0, "r_d": 0.5, "r_u": 0.75, "repetition": 0.25, "r_f": 1.0,
                                              "admitted": True, "suppressed": False}
    assert frontier["dup"]["reward"] == paper["dup"]["reward"] == pytest.approx(2 / 3)
    assert paper["half"]["components"] == {"s_q": 1.0, "r_d": 0.5, "r_f": 1.0, "admitted": True, "suppressed": False}


def test_a_role_without_a_reward_formula_raises_instead_of_scoring_as_the_solver():
    from types import SimpleNamespace

    from sage.stages.score import _reward

    ctx = SimpleNamespace(cfg=SimpleNamespace(rewards=W))
    row = dict(rollout_id="r1", purpose="solve", format_reward=1.0, plan_s_p=None, plan_passed=False, s_gt=1.0)
    assert _reward({**row, "role": "solver"}, ctx)[0] == pytest.approx(W.solver_gt + W.solver_format)
    with pytest.raises(ValueError, match=r"rollout r1 has role 'referee', which has no reward formula"):
        _reward({**row, "role": "referee"}, ctx)
