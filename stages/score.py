"""Score: every rollout's reward (SAGE.md, "Score" and "Roles") and its TRR++ advantage.

The formulas are pure functions at the top of this module so they can be read against SAGE.md and tested
on hand-computed values. Each reward function returns `(reward, components)`; the components are what the
`scores` table stores as JSON, so a reward can always be explained from its row.

The stage (`run`, at the bottom): reads every trainable rollout of the iteration (challenge, both critiques,
plan, solve) with what its reward needs; writes one `scores` row each (reward, components, TRR++ group and
advantage, `reward_version`) in one transaction. Idempotency key: `score_id` = hash of (rollout id,
REWARD_VERSION); a re-run computes the same values and inserts nothing new, while a re-score after a change of
the formulas (a new REWARD_VERSION) adds rows beside the old ones, and readers take the newest version.
Fails: an admitted Challenger question that was never probed raises; so does a Solver
answer without a verdict (a missing verdict is never scored as a wrong answer) and an iteration with nothing
to score.
"""
# pyright: basic

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from sage.configs.names import Purpose, Role, Stage
from sage.configs.schema import RewardsConfig
from sage.stages.context import RunContext, StageReport
from sage.warehouse.ids import content_id
from sage.warehouse.queries import scoring_inputs

#: Version of the reward formulas below. Bump it whenever a formula changes: it is hashed into every score id,
#: so rewards of different versions never share a row. 1: suppressed Challenger branch (s_q + r_f) / 2;
#: 2: (s_q + r_f) / 3 (SAGE.md step 4); 3: the difficulty third only for an admitted question.
REWARD_VERSION = 3


def score_id(rollout_id: str, version: int = REWARD_VERSION) -> str:
    """The id of a rollout's `scores` row under reward-formula `version`."""
    return content_id("score", rollout_id, version)


def challenger_reward(s_q: float, r_d: float | None, r_f: float, admitted: bool) -> tuple[float, dict[str, Any]]:
    """r_c = (s_q + r_d + r_f) / 3 when the question was admitted, else (s_q + r_f) / 3 (quality suppression:
    the difficulty third is withheld, so for the same s_q and r_f an admitted question never earns less than a
    rejected one).

    SAGE.md pays the difficulty third when s_q >= alpha and the verifier is valid; admission is that and more
    (a grounded label, not a duplicate, near-duplicate or copy of a held-out question). A question no Solver
    can match because its label is wrong, or a copy of one already in the pool, would otherwise earn the most
    difficulty exactly for being wrong or copied."""
    if admitted:
        if r_d is None:
            raise ValueError("challenger_reward: r_d (difficulty) is needed for an admitted question; run the "
                             "difficulty probe first")
        reward = (s_q + r_d + r_f) / 3
    else:
        reward = (s_q + r_f) / 3
    return reward, {"s_q": s_q, "r_d": r_d, "r_f": r_f, "admitted": bool(admitted), "suppressed": not admitted}


def uncertainty(r_d: float | None, repetition: float | None, weight: float) -> float | None:
    """R-Zero's difficulty term: max(0, 1 - 2|p - 0.5| - weight x repetition), p = 1 - r_d the probes' mean s_gt and
    `repetition` the share of the Challenger's batch the question repeats (`questions.batch_repetition`, 0 when not
    measured). It pays most for a question the Solver answers right half the time, none for one it always or never
    does; None without a probe (`challenger_reward` then refuses an admitted question, as for r_d)."""
    if r_d is None:
        return None
    return max(0.0, 1.0 - 2.0 * abs(0.5 - r_d) - weight * (repetition or 0.0))


def planner_reward(s_p: float, r_f: float, w: RewardsConfig) -> tuple[float, dict[str, Any]]:
    """r_p = w_critic * s_p + w_format * r_f (0.5 / 0.5 by default)."""
    reward = w.planner_critic * s_p + w.planner_format * r_f
    return reward, {"s_p": s_p, "r_f": r_f}


def solver_reward(s_p_tilde: float, s_gt: float, r_f: float, w: RewardsConfig) -> tuple[float, dict[str, Any]]:
    """r_s = w_plan * s~_p + w_gt * s_gt + w_format * r_f (0.2 / 0.6 / 0.2). s~_p is the plan's score when
    the plan passed the gate and was shown, 0 when it was withheld (and for probe answers, and every answer
    without the Planner, `iteration.planner` false: none had a plan)."""
    reward = w.solver_plan * s_p_tilde + w.solver_gt * s_gt + w.solver_format * r_f
    return reward, {"s_p_tilde": s_p_tilde, "s_gt": s_gt, "r_f": r_f}


def critic_reward(r_f: float) -> tuple[float, dict[str, Any]]:
    """The Critic is rewarded for format only."""
    return r_f, {"r_f": r_f}


#: The score of a Critic reply with no score on its scale (SAGE.md: the neutral 0.5 [MAE]).
NEUTRAL = 0.5


def critic_score(parsed: dict) -> float:
    """s_q or s_p from a Critic rollout's parsed fields: its normalised score, or `NEUTRAL` when it gave none."""
    value = parsed.get("score")
    return NEUTRAL if value is None else float(value)


def gate(s_p: float, beta: float) -> bool:
    """True when the Solver may see the plan: s_p >= beta."""
    return s_p >= beta


def trr_group(role: str, domain: str | None, group_by: str) -> str:
    """The TRR++ group of a rollout: its role, or role x domain when `rewards.group_by` is role_domain."""
    if group_by == "role":
        return role
    if group_by == "role_domain":
        return f"{role}/{domain}"
    raise ValueError(f"group_by must be 'role' or 'role_domain', got {group_by!r}")


def trr_advantages(rewards: list[float], groups: list[str], eps: float) -> list[float]:
    """Task-Relative REINFORCE++: A = (r - mean_g) / (std_g + eps) inside each group (population std).

    A group of one, or one whose rewards are all equal, gets 0.0 for every member (no signal to learn)."""
    if len(rewards) != len(groups):
        raise ValueError(f"trr_advantages: {len(rewards)} rewards but {len(groups)} groups; give one group "
                         "label per reward")
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    advantages = [0.0] * len(rewards)
    for idx in members.values():
        values = [float(rewards[i]) for i in idx]
        if len(values) < 2 or max(values) == min(values):
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        for i, v in zip(idx, values):
            advantages[i] = (v - mean) / (std + eps)
    return advantages


# ------------------------------------------------------------------------------------------ the stage
def _reward(row: dict, ctx: RunContext) -> tuple[float, dict[str, Any]]:
    """A rollout's reward by its role's formula. Raises ValueError for a role with none: a role added to `Role`
    needs its reward here before its rollouts can be scored."""
    w, r_f, role = ctx.cfg.rewards, float(row["format_reward"] or 0.0), row["role"]
    if role == Role.CHALLENGER:
        s_q, admitted = float(row["s_q"] or 0.0), bool(row["admitted"])
        if w.challenger_difficulty == "uncertainty":  # R-Zero's term in place of r_d (rewards.challenger_difficulty)
            r_u = uncertainty(row["difficulty"], row["batch_repetition"], w.repetition_weight)
            reward, parts = challenger_reward(s_q, r_u, r_f, admitted)
            return reward, {**parts, "r_d": row["difficulty"], "r_u": r_u, "repetition": row["batch_repetition"]}
        return challenger_reward(s_q, row["difficulty"], r_f, admitted)
    if role == Role.CRITIC:
        return critic_reward(r_f)
    if role == Role.PLANNER:
        return planner_reward(float(row["plan_s_p"] if row["plan_s_p"] is not None else 0.0), r_f, w)
    if role == Role.SOLVER:
        s_p_tilde = float(row["plan_s_p"]) if row["plan_passed"] else 0.0
        return solver_reward(s_p_tilde, float(row["s_gt"]), r_f, w)
    raise ValueError(f"score: rollout {row['rollout_id']} has role {role!r}, which has no reward formula; "
                     f"give it one in stages/score.py `_reward`")


def check_inputs(rows: list[dict], run_id: str, iteration: int) -> None:
    """Refuse to score an iteration with no rollouts, or with Solver answers that have no verdict: s_gt 0 would
    train the Solver on failures that never happened."""
    where = f"iteration {iteration} of run {run_id!r}"
    if not rows:
        raise RuntimeError(f"score: {where} has no rollouts to score; run its earlier stages first (`sage run`)")
    unverified = [r["rollout_id"] for r in rows if r["purpose"] == Purpose.SOLVE and r["s_gt"] is None]
    if unverified:
        raise RuntimeError(f"score: {len(unverified)} Solver answer(s) of {where} have no verdict "
                           f"({', '.join(unverified[:3])}{', ...' if len(unverified) > 3 else ''}); run "
                           f"`sage stage verify --run {run_id} --iteration {iteration}` first, then score")


def run(ctx: RunContext) -> StageReport:
    rows = scoring_inputs(ctx.wh, ctx.run_id, ctx.iteration)
    check_inputs(rows, ctx.run_id, ctx.iteration)
    scored = [_reward(r, ctx) for r in rows]
    groups = [trr_group(r["role"], r["domain"], ctx.cfg.rewards.group_by) for r in rows]
    advantages = trr_advantages([s[0] for s in scored], groups, ctx.cfg.rewards.eps)
    out = [dict(score_id=score_id(r["rollout_id"]), rollout_id=r["rollout_id"], reward_version=REWARD_VERSION,
                run_id=ctx.run_id, iteration=ctx.iteration, role=r["role"],
                domain=r["domain"], reward=reward, components=components, group_key=g, advantage=a)
           for r, (reward, components), g, a in zip(rows, scored, groups, advantages)]
    added = ctx.wh.insert_batch("scores", out)
    by_role: dict[str, list[float]] = {}
    for r, (reward, _) in zip(rows, scored):
        by_role.setdefault(r["role"], []).append(reward)
    return StageReport(Stage.SCORE, rows_in=len(rows), rows_out=added,
                       info={f"mean_reward_{role}": round(sum(v) / len(v), 3) for role, v in sorted(by_role.items())})
