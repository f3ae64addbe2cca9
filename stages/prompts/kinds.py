"""The prompt kinds: which template a prompt is filled from (stages/prompts), one per role, domain and form.

A kind's value names its template in every prompt set and starts its template version (`solver_math@<hash>`),
which is hashed into row ids, so values are never edited. Stages name a kind through the constructors
(`PromptKind.solver(domain, plan=...)`, `PromptKind.challenger(domain, math_labels)`), never by formatting a
string, so a kind that has no template is an error where it is asked for.
"""
# pyright: basic

from __future__ import annotations

from enum import StrEnum

from sage.configs.names import Role


class PromptKind(StrEnum):
    CHALLENGER_MATH = "challenger_math"                # grounded math: question, program, answer
    CHALLENGER_MATH_ANSWER = "challenger_math_answer"  # the paper's answer-only Challenger (`math_labels: answer`)
    CHALLENGER_CODE = "challenger_code"
    CRITIC_QUESTION = "critic_question"                # s_q of a new question
    CRITIC_PLAN = "critic_plan"                        # s_p of a plan (the gate)
    PLANNER = "planner"
    SOLVER_MATH = "solver_math"
    SOLVER_CODE = "solver_code"
    SOLVER_MATH_PLAN = "solver_math_plan"              # the Solver shown a plan
    SOLVER_CODE_PLAN = "solver_code_plan"

    @classmethod
    def challenger(cls, domain: str, math_labels: str = "agreement") -> PromptKind:
        """The Challenger's kind (and output format) for a reference question of `domain`."""
        if domain == "math" and math_labels == "answer":
            return cls.CHALLENGER_MATH_ANSWER
        return cls._named(f"challenger_{domain}")

    @classmethod
    def solver(cls, domain: str, plan: bool = False) -> PromptKind:
        """The Solver's kind for a question of `domain`, shown a plan or not."""
        return cls._named(f"solver_{domain}_plan" if plan else f"solver_{domain}")

    @classmethod
    def _named(cls, value: str) -> PromptKind:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"no prompt kind {value!r}: the domain must be 'math' or 'code'") from None

    @property
    def role(self) -> Role:
        """The role whose prompt this is."""
        return Role(self.value.partition("_")[0])

    @property
    def shows_plan(self) -> bool:
        """Whether the Solver sees a plan in this prompt (`rollouts.plan_shown`)."""
        return self in (PromptKind.SOLVER_MATH_PLAN, PromptKind.SOLVER_CODE_PLAN)
