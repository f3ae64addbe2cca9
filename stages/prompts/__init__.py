"""Versioned prompt templates for the four roles (SAGE.md, "Roles"), one per kind.

`render(kind, **fields)` returns chat messages; `TEMPLATE_VERSION[kind]` is hashed into every row id a
stage writes, so changing a prompt means bumping its version (`"planner@1"` -> `"planner@2"`), and rows
made with the old prompt are never mistaken for new ones.

Each prompt is short (the CPU profile runs a 135M model with a 2048-token context) and ends with one worked
example of the exact output format, the tags that `engines/tags.py` parses. Inserted fields longer than
MAX_FIELD_CHARS are cut (marked with "...") so a runaway generated question cannot overflow the context.
Code kinds take an optional `signature` (the function the answer must define).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_FIELD_CHARS = 3000


@dataclass(frozen=True)
class Template:
    version: str
    system: str
    user: str                           # `{{name}}` placeholders
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()      # rendered through `{{name_line}}`: empty when not given


_SYSTEM = "You are a careful assistant. Reply in exactly the format of the example."

_CHALLENGER_MATH = """Reference problem:
{{question}}

Write ONE new math problem that is related to the reference but different (change the numbers, the objects \
or what is asked). It must have a single exact answer. Put the new problem in <question></question> and its \
final answer in <answer></answer>. Write nothing else.

Example:
<question>A box holds 12 pens. How many pens are in 7 boxes?</question>
<answer>84</answer>"""

_CHALLENGER_CODE = """Reference task:
{{question}}{{signature_line}}

Write ONE new Python task that is related to the reference but different. Reply with four tags:
<question> the task in words </question>
<signature> the def line of the function </signature>
<solution> a correct solution in a ```python block </solution>
<inputs> 3 to 5 test inputs, one JSON list of arguments per line </inputs>

Example:
<question>Return the sum of the squares of a list of integers.</question>
<signature>def sum_squares(xs: list) -> int</signature>
<solution>
```python
def sum_squares(xs: list) -> int:
    return sum(x * x for x in xs)
```
</solution>
<inputs>
[[1, 2, 3]]
[[]]
[[-4, 5]]
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
{{question}}{{signature_line}}

Example:
<plan>
1. Find how many pens one box holds.
2. Multiply by the number of boxes.
3. Check the result.
</plan>"""

_SOLVER_MATH = """Solve this problem. Think briefly, then give the final answer as \
<answer>\\boxed{...}</answer>.

Problem:
{{question}}
{{plan_block}}
Example reply:
7 boxes of 12 pens: 7 * 12 = 84. <answer>\\boxed{84}</answer>"""

_SOLVER_CODE = """Solve this task in Python. Think briefly, then put the whole function in one ```python \
block inside <answer></answer>.

Task:
{{question}}{{signature_line}}
{{plan_block}}
Example reply:
Add the squares with a generator.
<answer>
```python
def sum_squares(xs: list) -> int:
    return sum(x * x for x in xs)
```
</answer>"""

_PLAN_BLOCK = """
Plan (follow it):
{{plan}}
"""

TEMPLATES: dict[str, Template] = {
    "challenger_math": Template("challenger_math@1", _SYSTEM, _CHALLENGER_MATH, ("question",)),
    "challenger_code": Template("challenger_code@1", _SYSTEM, _CHALLENGER_CODE, ("question",), ("signature",)),
    "critic_question": Template("critic_question@1", _SYSTEM, _CRITIC_QUESTION, ("question",), ("signature",)),
    "critic_plan": Template("critic_plan@1", _SYSTEM, _CRITIC_PLAN, ("question", "plan"), ("signature",)),
    "planner": Template("planner@1", _SYSTEM, _PLANNER, ("question",), ("signature",)),
    "solver_math": Template("solver_math@1", _SYSTEM, _SOLVER_MATH.replace("{{plan_block}}", ""), ("question",)),
    "solver_code": Template("solver_code@1", _SYSTEM, _SOLVER_CODE.replace("{{plan_block}}", ""), ("question",),
                            ("signature",)),
    "solver_math_plan": Template("solver_math_plan@1", _SYSTEM,
                                 _SOLVER_MATH.replace("{{plan_block}}", _PLAN_BLOCK), ("question", "plan")),
    "solver_code_plan": Template("solver_code_plan@1", _SYSTEM,
                                 _SOLVER_CODE.replace("{{plan_block}}", _PLAN_BLOCK), ("question", "plan"),
                                 ("signature",)),
}

TEMPLATE_VERSION: dict[str, str] = {kind: t.version for kind, t in TEMPLATES.items()}
KINDS: tuple[str, ...] = tuple(TEMPLATES)

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_OPTIONAL_LINES = {"signature": "\nFunction: {}"}


def _clip(value: object) -> str:
    text = str(value).strip()
    return text if len(text) <= MAX_FIELD_CHARS else text[:MAX_FIELD_CHARS] + " ..."


def render(kind: str, **fields: object) -> list[dict[str, str]]:
    """Chat messages (system, user) for one prompt of `kind` with its fields filled in."""
    if kind not in TEMPLATES:
        raise ValueError(f"unknown prompt kind {kind!r}; expected one of: {', '.join(KINDS)}")
    t = TEMPLATES[kind]
    missing = [f for f in t.required if fields.get(f) is None]
    unknown = sorted(set(fields) - set(t.required) - set(t.optional))
    if missing or unknown:
        raise ValueError(f"prompt {kind!r} takes fields {list(t.required)} (optional {list(t.optional)}); "
                         f"missing {missing}, unexpected {unknown}")
    values = {f: _clip(fields[f]) for f in t.required}
    for f in t.optional:
        given = fields.get(f)
        values[f"{f}_line"] = _OPTIONAL_LINES[f].format(_clip(given)) if given else ""
    # One pass, so text inside a field (say "{{plan}}" in a question) is never substituted again.
    user = _PLACEHOLDER.sub(lambda m: values[m.group(1)], t.user)
    return [{"role": "system", "content": t.system}, {"role": "user", "content": user}]
