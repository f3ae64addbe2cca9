"""Prompt templates for the four roles (SAGE.md, "Roles"), one per kind (`PromptKind`, stages/prompts/kinds.py).

`render(kind, **fields)` returns chat messages. `TEMPLATE_VERSION[kind]` (`"planner@<hash>"`) is a hash of
everything the template puts in a prompt (system text, task text, worked example, optional lines) and is
hashed into every row id a stage writes, so an edited prompt gets new ids by itself and rows made with the
old prompt are never mistaken for new ones.

Each prompt shows one worked example of the exact output format, the tags `engines/text/tags.py` parses (each
reply scores 1.0 there and fits the role's constraint regex). Challenger, Planner and Solver show it as an
earlier turn: the same template filled with the example's fields as a user message, the reply as the
assistant's, then the real task. Shown inline ("Example reply:" after the task), SmolLM2-135M copied it
into unrelated answers, which then looped to the token limit; after a separate turn it answers the last
message (`experiments/prompts.py` measures both). Those examples are tasks unlike the seeds' (a train's
speed, counting vowels) and write no placeholder such as `\\boxed{...}`, which the model wrote literally.
The Critic keeps its inline example: as a turn it copied no less and told good questions from bad ones no
better.

Two prompt sets hold every kind (`roles.prompts`): `short` (`TEMPLATES`, above; cpu.yaml) asks for the tags with
little or no reasoning, what the 135M model finishes within a few hundred tokens; `reasoning`
(`REASONING_TEMPLATES`; paper-7b.yaml) has each role reason step by step first and then write the same tags, for
a 7B-class model with thousands of tokens, its worked examples showing reasoning before the tags. Text outside
the tags is allowed by the parsers and the format reward (engines/text/tags.py), so rewards and verifiers are
the same under either set; a kind's version differs between the sets, so their rows never share ids. A third set,
`compose`, is `short` with the grounded math Challenger asked to compose operations of its reference's kind into one
computation (`gcd(6 * 4, 18)`, `x + 12 = 5 * 6`) rather than reword it with new numbers; only that kind's version
differs from `short`'s.

Inserted fields are cut (marked with "...") so a runaway generated question cannot overflow the context:
with a `FieldLimit` (what the stages pass: the model's tokenizer and the tokens left once the template and
the role's `max_new_tokens` are taken from `model.max_model_len`, shared among the fields) at that many
tokens; without one, at MAX_FIELD_CHARS characters. Code kinds, the Planner's and the Critic's take an
optional `signature` (the function the answer must define).
"""
# pyright: basic

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sage.stages.prompts.kinds import PromptKind

#: The cut for a field when no tokenizer is at hand (a scripted engine).
MAX_FIELD_CHARS = 3000
#: The fewest tokens a field keeps however short the context is (the engine then shortens the completion).
MIN_FIELD_TOKENS = 32


@dataclass(frozen=True)
class Template:
    kind: str
    system: str
    user: str                           # `{{name}}` placeholders
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()      # rendered through `{{name_line}}`: empty when not given
    example: dict[str, str] = field(default_factory=dict)  # the worked example's fields; empty: shown inline
    reply: str = ""                     # the worked example's answer, shown as the assistant's turn
    # Worked examples per question family (a seed's `source`, e.g. `reasoning_gym:gcd`), chosen by the `family`
    # field; `example` / `reply` serve every other family
    examples: dict[str, tuple[dict[str, str], str]] = field(default_factory=dict)


SYSTEM = "You are a careful assistant."
_SYSTEM_INLINE = "You are a careful assistant. Reply in exactly the format of the example."

# -- the worked examples' tasks ------------------------------------------------------------------------------
_EX_MATH = "A train travels at 60 km per hour for 3 hours. How many kilometres does it travel?"
_EX_MATH_PLAN = "1. Note the speed and the time.\n2. Multiply speed by time."
_EX_CODE = ("Write a Python function `count_vowels` that returns how many vowels (a, e, i, o, u) a string has.\n\n"
            "Input:\n  `text` (str): any string.\n\nOutput:\n  `return` (int): the number of vowels.")
_EX_CODE_PLAN = "1. Lower-case the text.\n2. Count the characters that are vowels."
_EX_CODE_BLOCK = """```python
def count_vowels(text: str) -> int:
    return sum(c in "aeiou" for c in text.lower())
```"""

_CHALLENGER_MATH = """Reference problem:
{{question}}

Write ONE new math problem that is related to the reference but different (change the numbers, the objects \
or what is asked). It must have a single exact answer. Put the new problem in <question></question> and its \
final answer in <answer></answer>. Write nothing else."""

_CHALLENGER_MATH_REPLY = """<question>A cyclist rides at 15 km per hour for 4 hours. How many kilometres does \
she ride?</question>
<answer>60</answer>"""

# Grounded math (`iteration.math_labels: program`): beside its answer the Challenger writes a program that computes
# it; the sandbox runs it, and the label enters the pool only when the program's result and the answer agree
# (stages/challenge.py). The worked example is of the reference's own family when one is written for it (the
# seeds' generators): same kind and form, new numbers, one step harder, so that the new problem leaves the
# seed and validation sets (a one-digit sum with new numbers is often one of them) and the model varies its
# reference instead of copying one memorised puzzle (a generic word-problem example drew the same bat-and-ball
# puzzle in 12 of 24 outputs).
_CHALLENGER_GROUNDED = """Reference problem:
{{question}}

Write ONE new math problem of the same kind and form as the reference: new numbers, one step harder. It must \
have a single exact answer. Put the new problem in <question></question>, a Python function `solve()` that \
computes the answer from the problem's numbers (standard library only; `fractions.Fraction` for exact \
fractions) in <solution></solution>, and the final answer in <answer></answer>. Write nothing else."""


def _grounded_reply(question: str, body: str, answer: str) -> str:
    return (f"<question>{question}</question>\n<solution>\n```python\ndef solve():\n{body}\n```\n</solution>\n"
            f"<answer>{answer}</answer>")


_RG = "reasoning_gym:"
_GROUNDED_EXAMPLES: dict[str, tuple[dict[str, str], str]] = {
    f"{_RG}basic_arithmetic": ({"question": "Calculate 3 + 5."},
                               _grounded_reply("Calculate 12 + 7.", "    return 12 + 7", "19")),
    f"{_RG}products": ({"question": "Solve the following multiplication: 3 * 4. Give only the result as your final "
                                    "answer."},
                       _grounded_reply("Solve the following multiplication: 6 * 13. Give only the result as your "
                                       "final answer.", "    return 6 * 13", "78")),
    f"{_RG}chain_sum": ({"question": "State the final answer to the following arithmetic problem: 2 + 6 ="},
                        _grounded_reply("State the final answer to the following arithmetic problem: 5 + 3 + 8 =",
                                        "    return 5 + 3 + 8", "16")),
    f"{_RG}simple_equations": ({"question": "Find the value of x in the equation: x + 3 = 9"},
                               _grounded_reply("Find the value of x in the equation: x + 12 = 30",
                                               "    return 30 - 12", "18")),
    f"{_RG}gcd": ({"question": "Find the Greatest Common Divisor (GCD) of these numbers: 6, 9. Give only the GCD as "
                               "your final answer."},
                  _grounded_reply("Find the Greatest Common Divisor (GCD) of these numbers: 24, 36. Give only the "
                                  "GCD as your final answer.", "    import math\n    return math.gcd(24, 36)", "12")),
    f"{_RG}lcm": ({"question": "Find the Least Common Multiple (LCM) of these numbers: 2, 3"},
                  _grounded_reply("Find the Least Common Multiple (LCM) of these numbers: 4, 10",
                                  "    import math\n    return math.lcm(4, 10)", "20")),
}

# Composite math (`roles.prompts: compose`): the grounded Challenger composes operations of the reference's kind
# into one computation, as AZR builds questions from composite programs, instead of rewording the reference with new
# numbers (every question admitted under `short` did). The question states every number the program uses, so the
# number check (engines/text/arithmetic.py) holds, and the program's result is the label.
_CHALLENGER_COMPOSE = """Reference problem:
{{question}}

Write ONE new math problem that composes two or three operations of the kind the reference uses into one \
computation: a chain of sums and products, an equation whose right side is itself a computation, the GCD of a \
product, ... It must have a single exact answer and state in digits every number the computation uses. Put the \
new problem in <question></question>, a Python function `solve()` that computes the answer from exactly the \
problem's numbers (standard library only; `fractions.Fraction` for exact fractions) in <solution></solution>, \
and the final answer in <answer></answer>. Write nothing else."""

_COMPOSE_EXAMPLES: dict[str, tuple[dict[str, str], str]] = {
    f"{_RG}basic_arithmetic": (_GROUNDED_EXAMPLES[f"{_RG}basic_arithmetic"][0],
                               _grounded_reply("Calculate (12 + 7) * 3.", "    return (12 + 7) * 3", "57")),
    f"{_RG}products": (_GROUNDED_EXAMPLES[f"{_RG}products"][0],
                       _grounded_reply("Calculate 6 * 13 + 4 * 5. Give only the result as your final answer.",
                                       "    return 6 * 13 + 4 * 5", "98")),
    f"{_RG}chain_sum": (_GROUNDED_EXAMPLES[f"{_RG}chain_sum"][0],
                        _grounded_reply("State the final answer to the following arithmetic problem: 5 + 3 * 8 - 2 =",
                                        "    return 5 + 3 * 8 - 2", "27")),
    f"{_RG}simple_equations": (_GROUNDED_EXAMPLES[f"{_RG}simple_equations"][0],
                               _grounded_reply("Find the value of x in the equation: x + 12 = 5 * 6",
                                               "    return 5 * 6 - 12", "18")),
    f"{_RG}gcd": (_GROUNDED_EXAMPLES[f"{_RG}gcd"][0],
                  _grounded_reply("Find the Greatest Common Divisor (GCD) of 6 * 4 and 18. Give only the GCD as your "
                                  "final answer.", "    import math\n    return math.gcd(6 * 4, 18)", "6")),
    f"{_RG}lcm": (_GROUNDED_EXAMPLES[f"{_RG}lcm"][0],
                  _grounded_reply("Find the Least Common Multiple (LCM) of 4 * 3 and 10",
                                  "    import math\n    return math.lcm(4 * 3, 10)", "60")),
}

_CHALLENGER_CODE = """Reference task:
{{question}}{{signature_line}}

Write ONE new Python task that is related to the reference but different. Reply with four tags:
<question> the task in words </question>
<signature> the def line of the function </signature>
<solution> a correct solution in a ```python block </solution>
<inputs> 3 to 5 test inputs, one JSON list of arguments per line </inputs>"""

_CHALLENGER_CODE_REPLY = """<question>Return how many digits a string contains.</question>
<signature>def count_digits(text: str) -> int</signature>
<solution>
```python
def count_digits(text: str) -> int:
    return sum(c.isdigit() for c in text)
```
</solution>
<inputs>
["a1b2"]
[""]
["2024"]
</inputs>"""

_CRITIC_QUESTION = """Rate this problem from 1 to 10. 1: unclear, unsolvable or nonsense. 10: clear, \
self-contained, solvable with one exact answer, and not trivial. Give one short reason, then the score as \
<score>N</score>.

Problem:
{{question}}{{signature_line}}

Example reply:
The problem is clear and has one exact answer, but it is easy. <score>6</score>"""

_CRITIC_PLAN = """Rate this plan for solving the problem from 1 to 10. 1: wrong or useless. 10: correct, \
complete and easy to follow. Give one short reason, then the score as <score>N</score>.

Problem:
{{question}}{{signature_line}}

Plan:
{{plan}}

Example reply:
The steps are correct but the last check is missing. <score>7</score>"""

_PLANNER = """Write a short numbered plan for solving this problem. Do not solve it. Put the plan in \
<plan></plan>.

Problem:
{{question}}{{signature_line}}"""

# "One or two short sentences", "and stop" and a one-line example keep the 135M model from looping once it
# has an answer ("show the key steps briefly": 3 of 20 validation answers ran to the token limit, against 0).
# The code Solver starts with <answer>: a fence opened before the tag turns the code's first `<` into the tag.
_SOLVER_MATH = """Solve the problem below. Show the calculation in one or two short sentences, then put the final \
answer in \\boxed{} inside <answer></answer> and stop.

Problem:
{{question}}{{plan_block}}"""

_SOLVER_CODE = """Solve this task in Python. Reply with <answer>, then the whole function the task names in \
one ```python block, then </answer>. Write nothing else.

Task:
{{question}}{{signature_line}}{{plan_block}}"""

_PLAN_BLOCK = """

Plan (follow it):
{{plan}}"""

_MATH = {"question": _EX_MATH}
# No `Function:` line in the code example: with one, the model annotated made-up signatures and looped more
# (format 75% vs 85% of 20 validation answers).
_CODE = {"question": _EX_CODE}


def _solver(kind: str, code: bool, plan: bool) -> Template:
    user = (_SOLVER_CODE if code else _SOLVER_MATH).replace("{{plan_block}}", _PLAN_BLOCK if plan else "")
    example = dict(_CODE if code else _MATH)
    if plan:
        example["plan"] = _EX_CODE_PLAN if code else _EX_MATH_PLAN
    reply = f"<answer>\n{_EX_CODE_BLOCK}\n</answer>" if code else \
        "Distance = speed * time = 60 * 3 = 180. <answer>\\boxed{180}</answer>"
    return Template(kind, SYSTEM, user, ("question", "plan") if plan else ("question",),
                    ("signature",) if code else (), example, reply)


TEMPLATES: dict[str, Template] = {
    "challenger_math": Template("challenger_math", SYSTEM, _CHALLENGER_GROUNDED, ("question",), (), _MATH,
                                _grounded_reply("A cyclist rides at 15 km per hour for 4 hours. How many kilometres "
                                                "does she ride?", "    return 15 * 4", "60"),
                                _GROUNDED_EXAMPLES),
    # The paper's answer-only Challenger (`iteration.math_labels: answer`)
    "challenger_math_answer": Template("challenger_math_answer", SYSTEM, _CHALLENGER_MATH, ("question",), (), _MATH,
                                       _CHALLENGER_MATH_REPLY),
    "challenger_code": Template("challenger_code", SYSTEM, _CHALLENGER_CODE, ("question",), ("signature",),
                                {"question": _EX_CODE.split("\n")[0]}, _CHALLENGER_CODE_REPLY),
    "critic_question": Template("critic_question", _SYSTEM_INLINE, _CRITIC_QUESTION, ("question",),
                                ("signature",)),
    "critic_plan": Template("critic_plan", _SYSTEM_INLINE, _CRITIC_PLAN, ("question", "plan"), ("signature",)),
    "planner": Template("planner", SYSTEM, _PLANNER, ("question",), ("signature",), _MATH,
                        f"<plan>\n{_EX_MATH_PLAN}\n3. Check the units.\n</plan>"),
    "solver_math": _solver("solver_math", code=False, plan=False),
    "solver_code": _solver("solver_code", code=True, plan=False),
    "solver_math_plan": _solver("solver_math_plan", code=False, plan=True),
    "solver_code_plan": _solver("solver_code_plan", code=True, plan=True),
}

# -- the `reasoning` set (roles.prompts: reasoning) ---------------------------------------------------------------
# The same tasks and tags; each role thinks step by step before its tagged output, and the worked examples show that
# order. Nothing asks for brevity: a 7B Solver with 8,192 tokens should work the problem out.
_SYSTEM_REASONING = ("You are a careful assistant. Think step by step before you answer, then give your final output "
                     "in the tags the task asks for.")
_SYSTEM_REASONING_INLINE = ("You are a careful assistant. Think step by step, then end your reply in the format of "
                            "the example.")

_R_CHALLENGER_MATH = """Reference problem:
{{question}}

Write ONE new math problem that is related to the reference but different (change the numbers, the objects \
or what is asked), at least as hard, with a single exact answer. First think step by step: design the problem, \
then solve it yourself to be sure of its answer. End your reply with the new problem in <question></question> \
and its final answer in <answer></answer>."""

_R_CHALLENGER_MATH_REPLY = """The reference multiplies a speed by a time. I will ask for the time instead, from \
a distance and a speed: 60 km at 15 km per hour takes 60 / 15 = 4 hours, a single exact answer.
<question>A cyclist rides 60 km at 15 km per hour. How many hours does the ride take?</question>
<answer>4</answer>"""

_R_CHALLENGER_GROUNDED = """Reference problem:
{{question}}

Write ONE new math problem of the same kind as the reference, with new numbers and one step harder, that has a \
single exact answer. First think step by step: design the problem, then solve it yourself. End your reply with \
the new problem in <question></question>, a Python function `solve()` that computes the answer from the \
problem's numbers (standard library only; `fractions.Fraction` for exact fractions) in <solution></solution>, \
and the final answer in <answer></answer>."""

_R_CHALLENGER_GROUNDED_REPLY = "The reference multiplies a speed by a time; I change the numbers: 15 km per hour " \
    "for 4 hours is 15 * 4 = 60 km.\n" + _grounded_reply(
        "A cyclist rides at 15 km per hour for 4 hours. How many kilometres does she ride?", "    return 15 * 4", "60")

_R_CHALLENGER_CODE = """Reference task:
{{question}}{{signature_line}}

Write ONE new Python task that is related to the reference but different. First think step by step: what the \
task asks, a correct solution, and test inputs that cover its edge cases. End your reply with four tags:
<question> the task in words </question>
<signature> the def line of the function </signature>
<solution> a correct solution in a ```python block </solution>
<inputs> 3 to 5 test inputs, one JSON list of arguments per line </inputs>"""

_R_CHALLENGER_CODE_REPLY = "The reference counts characters of one kind; the new task counts digits, and the " \
    "empty string and a string of digits only are its edge cases.\n" + _CHALLENGER_CODE_REPLY

_R_CRITIC_QUESTION = """Rate this problem from 1 to 10. 1: unclear, unsolvable or nonsense. 10: clear, \
self-contained, solvable with one exact answer, and not trivial. Think step by step: check that every quantity \
the problem needs is given, try to solve it, and judge how hard it is. Then end with the score as \
<score>N</score>.

Problem:
{{question}}{{signature_line}}

Example reply:
Every quantity is given and the problem has one exact answer; solving it takes a single multiplication, so it \
is easy. <score>6</score>"""

_R_CRITIC_PLAN = """Rate this plan for solving the problem from 1 to 10. 1: wrong or useless. 10: correct, \
complete and easy to follow. Think step by step: follow each step of the plan on the problem and check that it \
leads to the answer. Then end with the score as <score>N</score>.

Problem:
{{question}}{{signature_line}}

Plan:
{{plan}}

Example reply:
Step 1 reads the right quantities and step 2 combines them correctly, but no step checks the result. \
<score>7</score>"""

_R_PLANNER = """Think step by step about how to solve this problem, then write a numbered plan of the steps in \
<plan></plan> at the end of your reply. Do not carry the plan out or give the final answer.

Problem:
{{question}}{{signature_line}}"""

_R_PLANNER_REPLY = f"""The distance follows from the speed and the time, so the plan needs both and one product.
<plan>
{_EX_MATH_PLAN}
3. Check the units.
</plan>"""

_R_SOLVER_MATH = """Solve the problem below. Reason step by step, then end your reply with the final answer in \
\\boxed{} inside <answer></answer>.

Problem:
{{question}}{{plan_block}}"""

_R_SOLVER_CODE = """Solve this task in Python. Reason step by step about the approach and its edge cases, without \
code, then end your reply with <answer>, the whole function the task names in one ```python block, and \
</answer>.

Task:
{{question}}{{signature_line}}{{plan_block}}"""


def _reasoning_solver(kind: str, code: bool, plan: bool) -> Template:
    user = (_R_SOLVER_CODE if code else _R_SOLVER_MATH).replace("{{plan_block}}", _PLAN_BLOCK if plan else "")
    example = dict(_CODE if code else _MATH)
    if plan:
        example["plan"] = _EX_CODE_PLAN if code else _EX_MATH_PLAN
    reply = (f"Vowels may be upper or lower case, so lower-case the text first, then count the characters that are "
             f"one of a, e, i, o, u; an empty string has none.\n<answer>\n{_EX_CODE_BLOCK}\n</answer>") if code else \
        ("The train covers 60 km in each of 3 hours.\nDistance = speed * time = 60 * 3 = 180 km.\n"
         "<answer>\\boxed{180}</answer>")
    return Template(kind, _SYSTEM_REASONING, user, ("question", "plan") if plan else ("question",),
                    ("signature",) if code else (), example, reply)


REASONING_TEMPLATES: dict[str, Template] = {
    "challenger_math": Template("challenger_math", _SYSTEM_REASONING, _R_CHALLENGER_GROUNDED, ("question",), (),
                                _MATH, _R_CHALLENGER_GROUNDED_REPLY),
    "challenger_math_answer": Template("challenger_math_answer", _SYSTEM_REASONING, _R_CHALLENGER_MATH,
                                       ("question",), (), _MATH, _R_CHALLENGER_MATH_REPLY),
    "challenger_code": Template("challenger_code", _SYSTEM_REASONING, _R_CHALLENGER_CODE, ("question",),
                                ("signature",), {"question": _EX_CODE.split("\n")[0]}, _R_CHALLENGER_CODE_REPLY),
    "critic_question": Template("critic_question", _SYSTEM_REASONING_INLINE, _R_CRITIC_QUESTION, ("question",),
                                ("signature",)),
    "critic_plan": Template("critic_plan", _SYSTEM_REASONING_INLINE, _R_CRITIC_PLAN, ("question", "plan"),
                            ("signature",)),
    "planner": Template("planner", _SYSTEM_REASONING, _R_PLANNER, ("question",), ("signature",), _MATH,
                        _R_PLANNER_REPLY),
    "solver_math": _reasoning_solver("solver_math", code=False, plan=False),
    "solver_code": _reasoning_solver("solver_code", code=True, plan=False),
    "solver_math_plan": _reasoning_solver("solver_math_plan", code=False, plan=True),
    "solver_code_plan": _reasoning_solver("solver_code_plan", code=True, plan=True),
}

#: The short set with the grounded math Challenger asked for a composite problem (`_CHALLENGER_COMPOSE`).
COMPOSE_TEMPLATES: dict[str, Template] = {
    **TEMPLATES,
    "challenger_math": Template("challenger_math", SYSTEM, _CHALLENGER_COMPOSE, ("question",), (), _MATH,
                                _grounded_reply("A cyclist rides at 15 km per hour for 4 hours, then at 12 km per "
                                                "hour for 2 hours. How many kilometres does she ride in total?",
                                                "    return 15 * 4 + 12 * 2", "84"),
                                _COMPOSE_EXAMPLES),
}

#: `roles.prompts` -> its templates, one per kind.
PROMPT_SETS: dict[str, dict[str, Template]] = {"short": TEMPLATES, "reasoning": REASONING_TEMPLATES,
                                               "compose": COMPOSE_TEMPLATES}

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_OPTIONAL_LINES = {"signature": "\nFunction: {}"}


def template_version(t: Template) -> str:
    """`kind@<hash>` of everything `t` puts in a prompt: editing any of it gives new row ids."""
    parts = [t.kind, t.system, t.user, repr(t.required), repr(t.optional), repr(sorted(t.example.items())), t.reply,
             repr([(f, _OPTIONAL_LINES[f]) for f in t.optional])]
    if t.examples:
        parts.append(repr(sorted((k, sorted(f.items()), r) for k, (f, r) in t.examples.items())))
    return f"{t.kind}@{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:10]}"


#: prompt set -> kind -> version.
VERSIONS: dict[str, dict[str, str]] = {name: {kind: template_version(t) for kind, t in templates.items()}
                                       for name, templates in PROMPT_SETS.items()}
#: The `short` set's versions (cpu.yaml's).
TEMPLATE_VERSION: dict[str, str] = VERSIONS["short"]
KINDS: tuple[PromptKind, ...] = tuple(PromptKind)


def version(kind: str, prompt_set: str = "short") -> str:
    """The version of `kind` in `prompt_set` (`roles.prompts`): what a stage hashes into its row ids."""
    return VERSIONS[prompt_set][kind]


@dataclass(frozen=True)
class FieldLimit:
    """Cut each inserted field to `tokens` tokens of `tokenizer` (a transformers tokenizer)."""

    tokens: int
    tokenizer: Any = field(compare=False, hash=False)

    def clip(self, text: str) -> str:
        text = text[:self.tokens * 32]  # bounds the tokenizer's work; no token is 32 characters long
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= self.tokens else self.tokenizer.decode(ids[:self.tokens]).rstrip() + " ..."


@lru_cache(maxsize=256)
def _field_limit(kind: str, tokenizer: Any, max_model_len: int, max_new_tokens: int, prompt_set: str) -> FieldLimit:
    t = PROMPT_SETS[prompt_set][kind]

    def tokens(family: str | None) -> int:
        empty = render(kind, None, family, prompt_set, **{f: "" for f in t.required})
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(empty, add_generation_prompt=True, tokenize=False)
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])  # as the engines count a prompt
        return sum(len(tokenizer.encode(m["content"], add_special_tokens=False)) + 8 for m in empty)

    fixed = max(tokens(family) for family in (None, *t.examples))  # the longest worked example
    fixed += sum(len(tokenizer.encode(_OPTIONAL_LINES[f].format(""), add_special_tokens=False)) for f in t.optional)
    # 8 tokens a field for the " ..." mark and for merges where a field's text meets the template's
    room = (max_model_len - max_new_tokens - fixed) // (len(t.required) + len(t.optional)) - 8
    return FieldLimit(max(room, MIN_FIELD_TOKENS), tokenizer)


def field_limit(kind: str, tokenizer: Any | None, max_model_len: int, max_new_tokens: int,
                prompt_set: str = "short") -> FieldLimit | None:
    """The per-field token limit for prompts of `kind` (of `prompt_set`): what `max_model_len` leaves once the
    template's own tokens and the completion's `max_new_tokens` are taken, shared equally among the template's
    fields (at least MIN_FIELD_TOKENS). None without a tokenizer (render then cuts at MAX_FIELD_CHARS characters)."""
    if tokenizer is None:
        return None
    return _field_limit(kind, tokenizer, max_model_len, max_new_tokens, prompt_set)


def _clip(value: object, limit: FieldLimit | None) -> str:
    text = str(value).strip()
    if limit is not None:
        return limit.clip(text)
    return text if len(text) <= MAX_FIELD_CHARS else text[:MAX_FIELD_CHARS] + " ..."


def _fill(t: Template, fields: dict, limit: FieldLimit | None = None) -> str:
    values = {f: _clip(fields[f], limit) for f in t.required}
    for f in t.optional:
        given = fields.get(f)
        values[f"{f}_line"] = _OPTIONAL_LINES[f].format(_clip(given, limit)) if given else ""
    # One pass, so text inside a field (say "{{plan}}" in a question) is never substituted again.
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], t.user)


def render(kind: str, limit: FieldLimit | None = None, family: str | None = None, prompt_set: str = "short",
           **fields: object) -> list[dict[str, str]]:
    """Chat messages for one prompt of `kind` from `prompt_set` (`roles.prompts`): system, the worked example's
    task (user) and reply (assistant) when the kind shows it as a turn (the example of the question's `family`
    when the kind has one), then the task itself (user, always the last message), its fields cut by `limit` (see
    `field_limit`)."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {prompt_set!r}; expected one of: {', '.join(PROMPT_SETS)}")
    if kind not in TEMPLATES:
        raise ValueError(f"unknown prompt kind {kind!r}; expected one of: {', '.join(KINDS)}")
    t = PROMPT_SETS[prompt_set][kind]
    if family in t.examples:
        example_fields, reply = t.examples[family]
        t = Template(t.kind, t.system, t.user, t.required, t.optional, example_fields, reply)
    missing = [f for f in t.required if fields.get(f) is None]
    unknown = sorted(set(fields) - set(t.required) - set(t.optional))
    if missing or unknown:
        raise ValueError(f"prompt {kind!r} takes fields {list(t.required)} (optional {list(t.optional)}); "
                         f"missing {missing}, unexpected {unknown}")
    example = [{"role": "user", "content": _fill(t, t.example)}, {"role": "assistant", "content": t.reply}] \
        if t.example else []
    return [{"role": "system", "content": t.system}, *example, {"role": "user", "content": _fill(t, fields, limit)}]
