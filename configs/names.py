"""The vocabulary the layers share: the names of the roles, of the rollout purposes and of the stages.

Every layer may import this module (it imports nothing of the project), so a name is spelled once. The
members are `StrEnum`s whose values are the strings the warehouse stores and hashes into row ids
(`rollouts.role`, `rollouts.purpose`, `scores.role`, `stage_runs.stage`): `Role.SOLVER == "solver"`, it
formats, hashes and serialises as "solver", and SQL keeps its literals. Changing a value changes stored
rows and row ids, so values are never edited, only added.

A stage that writes rollouts is named after the purpose it writes (`Stage.CRITIQUE_PLAN` writes purpose
`critique_plan`); `verify_probe` and `verify` write verdicts of the `probe` and `solve` rollouts.
"""
# pyright: basic

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """The four roles that share one model (SAGE.md, "Roles")."""
    CHALLENGER = "challenger"
    PLANNER = "planner"
    CRITIC = "critic"
    SOLVER = "solver"


class Purpose(StrEnum):
    """Why a rollout was generated (`rollouts.purpose`); part of every rollout id."""
    CHALLENGE = "challenge"                  # Challenger: a new question and its verifier
    CRITIQUE_QUESTION = "critique_question"  # Critic: s_q of a new question
    PROBE = "probe"                          # Solver, no plan: difficulty of a new question (not trained on)
    PLAN = "plan"                            # Planner: a plan for a pool question
    CRITIQUE_PLAN = "critique_plan"          # Critic: s_p of a plan (the gate)
    SOLVE = "solve"                          # Solver: an answer to a pool question, with the plan if it passed
    VALIDATE = "validate"                    # Solver, greedy: a held-out validation answer (not trained on)
    # validation of the Planner -> gate -> Solver pipeline (`validate.pipeline`; greedy, not trained on):
    VALIDATE_PLAN = "validate_plan"          # Planner: a plan for a validation question
    VALIDATE_CRITIQUE = "validate_critique"  # Critic: s_p of that plan (the gate)
    VALIDATE_HINTED = "validate_hinted"      # Solver: the validation question answered with that plan shown


# The purposes whose rollouts are scored and trained on (probes and validation answers are not).
TRAINED_PURPOSES = frozenset({Purpose.CHALLENGE, Purpose.CRITIQUE_QUESTION, Purpose.PLAN, Purpose.CRITIQUE_PLAN,
                              Purpose.SOLVE})


class Stage(StrEnum):
    """The stages the flow records in `stage_runs` and `sage stage NAME` re-runs, in SAGE.md's order."""
    SEED = "seed"
    CHALLENGE = "challenge"
    CRITIQUE_QUESTION = "critique_question"
    PROBE = "probe"
    VERIFY_PROBE = "verify_probe"
    ADMIT = "admit"
    PLAN = "plan"
    CRITIQUE_PLAN = "critique_plan"
    SOLVE = "solve"
    VERIFY = "verify"
    SCORE = "score"
    TRAIN = "train"
    VALIDATE = "validate"


#: The stages of one iteration in the order they run (SAGE.md): the one list the flow runs (flows/iteration.py),
#: a redo marks stale after the stage it redoes (warehouse/redo.py) and `sage status` sorts by. `seed` runs once
#: before them, `validate` after them; `Stage` declares its members in this same order.
ITERATION_STAGES = (Stage.CHALLENGE, Stage.CRITIQUE_QUESTION, Stage.PROBE, Stage.VERIFY_PROBE, Stage.ADMIT,
                    Stage.PLAN, Stage.CRITIQUE_PLAN, Stage.SOLVE, Stage.VERIFY, Stage.SCORE, Stage.TRAIN)
