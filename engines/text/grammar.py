"""Each role's output format as a regular expression, for constrained decoding, plus the tag vocabulary.

Holds the names shared with `sage.engines.text.tags` (which re-exports everything public here): `TAG_NAMES`,
`REQUIRED_TAGS` (the tags each role key must write), `DOMAINS`, and `role_key` (a role's key in
`REQUIRED_TAGS` / `ROLE_REGEX`). They live here, not in `sage.engines.text.tags`, so that the parsers can import the
regexes without an import cycle.

`ROLE_REGEX` is the strict format the parsers in `sage.engines.text.tags` check, as a regular expression in the dialect
shared by Python `re` and xgrammar (DESIGN.md, "Structured output per role"). Every string it matches parses
with format reward 1.0. Content may hold `<` except where it could start a SAGE tag (`<` followed by `/`, `<`, or
the first letter of a tag name), and every part has a bounded length so the closing tag comes within a small
token budget: `role_bounds` sizes the parts, `role_regex` builds the regex for any budget.
"""

from __future__ import annotations

from sage.configs.names import Role

TAG_NAMES = ("question", "answer", "signature", "solution", "inputs", "plan", "score")

REQUIRED_TAGS: dict[str, tuple[str, ...]] = {
    # Grounded math (`iteration.math_labels: program`): the question, a program that computes its answer, the
    # answer; the paper's answer-only form (`answer`) is `challenger_math_answer`.
    "challenger_math": ("question", "solution", "answer"),
    "challenger_math_answer": ("question", "answer"),
    "challenger_code": ("question", "signature", "solution", "inputs"),
    Role.PLANNER: ("plan",),
    Role.CRITIC: ("score",),
    "solver_math": ("answer",),
    "solver_code": ("answer",),
}

DOMAINS = ("math", "code")
#: The function a grounded math question's program defines; its return value is the program's answer.
MATH_PROGRAM_ENTRY = "solve"

# Prose (questions, reasoning, plans, answers) is a plain character class without `<`, with a bounded
# length so the closing tag is reached within the token budget. A bounded repetition of an alternation
# such as `(?:[^<]|<[^/])` costs xgrammar orders of magnitude more per token on a large vocabulary than a
# bounded character class or an unbounded alternation. Code needs `<`, so a code block allows `<` unless it
# could open or close a tag, unbounded (the fence and the token budget end it).
_TAG_INITIALS = "".join(sorted({n[0] for n in TAG_NAMES}))
_NOT_TAG = "</" + _TAG_INITIALS + _TAG_INITIALS.upper()
_TEXT = r"[^<]"
_CODE = rf"(?:[^<`]|<[^{_NOT_TAG}`])"       # no backticks: the fence closes the block
_FIRST = r"[!-;=-~]"                      # printable ASCII, not a space and not `<`: content is non-empty


CHARS_PER_TOKEN = 3.0   # rough average over prose, code and tags; the budget keeps a fifth in reserve
# Token budgets ROLE_REGEX is sized for; `role_regex(key, max_new_tokens)` sizes for any other budget.
DEFAULT_TOKENS = {"challenger_math": 256, "challenger_math_answer": 256, "challenger_code": 640, Role.PLANNER: 256,
                  Role.CRITIC: 128, "solver_math": 256, "solver_code": 512}


def _clamp(x: float, lo: int, hi: int) -> int:
    return int(max(lo, min(hi, x)))


def role_bounds(key: str, max_new_tokens: int | None = None,
                chars_per_token: float = CHARS_PER_TOKEN) -> dict[str, int]:
    """Most characters (content units) each free part of a role's output may take, so that the whole output,
    tags included, fits in about 80% of `max_new_tokens` at `chars_per_token`."""
    if key not in REQUIRED_TAGS:
        raise ValueError(f"unknown role key {key!r}; expected one of {sorted(map(str, REQUIRED_TAGS))}")
    chars = int((max_new_tokens or DEFAULT_TOKENS[key]) * chars_per_token * 0.8)
    if key == Role.CRITIC:
        return {"reasoning": max(0, chars - 16)}
    if key == Role.PLANNER:
        return {"plan": max(1, chars - 14)}
    if key == "solver_math":
        answer = _clamp(chars // 5, 8, 120)
        return {"reasoning": max(0, chars - answer - 18), "answer": answer}
    if key == "solver_code":
        code = max(20, int((chars - 40) * 0.8))
        return {"reasoning": max(0, chars - 40 - code), "code": code}
    if key == "challenger_math_answer":
        answer = _clamp(chars // 6, 8, 80)
        return {"question": max(10, chars - answer - 45), "answer": answer}
    if key == "challenger_math":
        answer = _clamp(chars // 8, 8, 40)
        avail = chars - answer - 90       # tags, fences and the `def solve():` line
        return {"question": max(10, int(avail * 0.5)), "code": max(20, int(avail * 0.5)), "answer": answer}
    avail = chars - 170                   # tags, fences, `def `, name (<= 30) and return type (<= 30)
    line = 40
    return {"question": max(10, int(avail * 0.3)), "params": _clamp(avail * 0.08, 10, 150),
            "code": max(20, int(avail * 0.44)), "input_line": line,
            "input_lines": _clamp(avail * 0.18 // (line + 3), 1, 10)}


def _text(n: int) -> str:
    return f"{_FIRST}{_TEXT}{{0,{max(0, n - 1)}}}"


def _py_block(n: int) -> str:  # `n` is kept for the budget arithmetic; the block itself is unbounded
    return rf"```python\n{_CODE}+```"


def role_regex(key: str, max_new_tokens: int | None = None, chars_per_token: float = CHARS_PER_TOKEN) -> str:
    """The role's output format as a regex (Python `re` and xgrammar dialect), sized for the token budget.
    Lower `chars_per_token` for tokenizers with short tokens (the tests' tiny one averages about 1.4)."""
    b = role_bounds(key, max_new_tokens, chars_per_token)
    if key == Role.CRITIC:
        return rf"{_TEXT}{{0,{b['reasoning']}}}<score>(?:10|[1-9])</score>"
    if key == Role.PLANNER:
        return rf"<plan>\n?{_text(b['plan'])}</plan>"
    if key == "solver_math":
        return rf"{_TEXT}{{0,{b['reasoning']}}}<answer>{_text(b['answer'])}</answer>"
    if key == "solver_code":
        return rf"{_TEXT}{{0,{b['reasoning']}}}<answer>\n{_py_block(b['code'])}\n</answer>"
    if key == "challenger_math_answer":
        return rf"<question>{_text(b['question'])}</question>\n<answer>{_text(b['answer'])}</answer>"
    if key == "challenger_math":
        return (rf"<question>{_text(b['question'])}</question>\n"
                rf"<solution>\n```python\ndef {MATH_PROGRAM_ENTRY}\(\):\n{_CODE}+```\n</solution>\n"
                rf"<answer>{_text(b['answer'])}</answer>")
    return (rf"<question>{_text(b['question'])}</question>\n"
            rf"<signature>def [A-Za-z_][A-Za-z0-9_]{{0,29}}\([^\n<()]{{0,{b['params']}}}\)"
            r"(?: -> [^\n<:]{1,26})?</signature>\n"
            rf"<solution>\n{_py_block(b['code'])}\n</solution>\n"
            rf"<inputs>\n(?:\[[^\n<]{{0,{b['input_line'] - 2}}}\]\n){{1,{b['input_lines']}}}</inputs>")


ROLE_REGEX: dict[str, str] = {key: role_regex(key) for key in REQUIRED_TAGS}


def role_key(role: Role | str, domain: str | None = None, math_labels: str = "program") -> str:
    """The key of `ROLE_REGEX` / `REQUIRED_TAGS` for a role: challenger and solver depend on the domain, a math
    Challenger on `iteration.math_labels` too (`answer`: the paper's answer-only form)."""
    if role in (Role.CHALLENGER, Role.SOLVER):
        if domain not in DOMAINS:
            raise ValueError(f"role '{role}' needs domain 'math' or 'code', got {domain!r}")
        if role == Role.CHALLENGER and domain == "math" and math_labels == "answer":
            return "challenger_math_answer"
        return f"{role}_{domain}"
    if role not in (Role.PLANNER, Role.CRITIC):
        raise ValueError(f"unknown role {role!r}; expected challenger, planner, critic or solver")
    return role
