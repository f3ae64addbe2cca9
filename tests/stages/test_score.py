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
    difficulty,
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


def test_challenger_earns_difficulty_when_good_and_valid():
    r, c = challenger_reward(s_q=0.8, r_d=0.5, r_f=1.0, valid=True, alpha=ALPHA)
    assert r == pytest.approx((0.8 + 0.5 + 1.0) / 3) == pytest.approx(0.766667, abs=1e-6)
    assert c == {"s_q": 0.8, "r_d": 0.5, "r_f": 1.0, "valid": True, "alpha": 0.7, "suppressed": False}
    r, _ = challenger_reward(s_q=0.7, r_d=0.25, r_f=1.0, valid=True, alpha=ALPHA)     # s_q == alpha counts
    assert r == pytest.approx(0.65)


def test_challenger_suppressed_by_low_quality_or_invalid_verifier():
    r, c = challenger_reward(s_q=0.6, r_d=0.9, r_f=1.0, valid=True, alpha=ALPHA)
    assert r == pytest.approx(1.6 / 3) and c["suppressed"]       # (0.6 + 1.0) / 3: difficulty third withheld
    r, c = challenger_reward(s_q=0.9, r_d=1.0, r_f=0.5, valid=False, alpha=ALPHA)
    assert r == pytest.approx(1.4 / 3) and c["suppressed"]       # (0.9 + 0.5) / 3
    r, _ = challenger_reward(s_q=0.2, r_d=None, r_f=0.0, valid=False, alpha=ALPHA)
    assert r == pytest.approx(0.2 / 3)                           # no probe needed when suppressed


def test_challenger_rejected_examples_of_the_issue_earn_less_than_admitted():
    # Critic 7 (s_q = 6/9, below alpha), format 1: rejected as low quality
    rejected, _ = challenger_reward(s_q=6 / 9, r_d=0.0, r_f=1.0, valid=True, alpha=ALPHA)
    assert rejected == pytest.approx((6 / 9 + 1) / 3) == pytest.approx(0.555556, abs=1e-6)   # was 0.833 with / 2
    # Critic 7.x admitted (s_q = 7/9), every probe passes (r_d = 0): the least an admitted question earns with r_f 1
    admitted, _ = challenger_reward(s_q=7 / 9, r_d=0.0, r_f=1.0, valid=True, alpha=ALPHA)
    assert admitted == pytest.approx(0.592593, abs=1e-6) and admitted > rejected
    # Critic 10 with a broken verifier: no longer the maximum 1.0
    broken, _ = challenger_reward(s_q=1.0, r_d=None, r_f=1.0, valid=False, alpha=ALPHA)
    assert broken == pytest.approx(2 / 3)


GRID = sorted({i / 9 for i in range(10)} | {ALPHA})     # every Critic score 1..10, normalised, and alpha itself
FORMATS = [0.0, 0.5, 1.0]
DIFFICULTIES = [0.0, 0.125, 1 / 3, 0.5, 0.875, 1.0]


def test_challenger_invariant_admission_never_earns_less_than_rejection():
    """SAGE.md step 4: for the same s_q and r_f, admission never earns less than rejection, over a grid of
    s_q (all ten Critic scores), r_d and r_f, both rejection causes (s_q < alpha or an invalid verifier)."""
    checked = 0
    for s_q in GRID:
        for r_f in FORMATS:
            for r_d in DIFFICULTIES:
                invalid, c_inv = challenger_reward(s_q, r_d, r_f, valid=False, alpha=ALPHA)
                assert c_inv["suppressed"]
                if s_q < ALPHA:      # rejected for quality whatever the verifier: both branches suppressed
                    assert challenger_reward(s_q, r_d, r_f, valid=True, alpha=ALPHA)[0] == invalid
                    continue
                admitted, c_adm = challenger_reward(s_q, r_d, r_f, valid=True, alpha=ALPHA)
                assert not c_adm["suppressed"]
                assert admitted >= invalid, (s_q, r_d, r_f)
                assert admitted - invalid == pytest.approx(r_d / 3)            # exactly the difficulty third
                # every question rejected for quality (lower s_q, any r_d) earns less than this admitted one
                for low in (q for q in GRID if q < ALPHA):
                    assert challenger_reward(low, r_d, r_f, valid=True, alpha=ALPHA)[0] < admitted + 1e-12
                checked += 1
    assert checked == 4 * 3 * 6          # s_q in {0.7, 7/9, 8/9, 1} x 3 formats x 6 difficulties

    with pytest.raises(ValueError, match="r_d"):
        challenger_reward(s_q=0.9, r_d=None, r_f=1.0, valid=True, alpha=ALPHA)


def test_challenger_empty_completion_and_unparseable_score():
    r_f = parse_planner("").format_reward                        # any role: empty completion -> 0.5
    s_q = parse_critic("I cannot decide.").fields["score"]       # unparseable -> neutral 0.5
    assert (r_f, s_q) == (0.5, 0.5)
    r, c = challenger_reward(s_q=s_q, r_d=1.0, r_f=r_f, valid=True, alpha=ALPHA)
    assert r == pytest.approx(1 / 3) and c["suppressed"]         # 0.5 < alpha: (0.5 + 0.5) / 3


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


def test_gate_and_difficulty():
    assert gate(0.3, 0.3) and not gate(0.2999, 0.3) and gate(1.0, 0.3)
    assert difficulty([1.0, 0.0, 0.0, 1.0]) == 0.5
    assert difficulty([1.0, 1.0]) == 0.0 and difficulty([0.0]) == 1.0
    assert difficulty([0.25, 0.75, 0.5]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        difficulty([])


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
    assert REWARD_VERSION == 2
    assert score_id("r1") == content_id("score", "r1", 2) == score_id("r1", 2)
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
