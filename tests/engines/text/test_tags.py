"""Role output parsers, the strict format reward, and the per-role regexes (compiled with xgrammar)."""

from __future__ import annotations

import random
import re

import pytest

from sage.configs.names import Role
from sage.engines.text.answers import last_boxed
from sage.engines.text.code import entry_point, parse_inputs
from sage.engines.text.tags import (
    REQUIRED_TAGS,
    ROLE_REGEX,
    Parsed,
    normalise_score,
    parse_challenger,
    parse_critic,
    parse_planner,
    parse_solver,
    role_bounds,
    role_key,
    role_regex,
)

pytestmark = pytest.mark.fast

CODE_OK = """<question>Add two integers.</question>
<signature>def add(a: int, b: int) -> int</signature>
<solution>
```python
def add(a: int, b: int) -> int:
    return a + b
```
</solution>
<inputs>
[1, 2]
[-3, 4]
</inputs>"""

# A grounded math Challenger's reply (`iteration.math_labels: program`): question, program, answer.
MATH_OK = """<question>What is 6 * 7?</question>
<solution>
```python
def solve():
    return 6 * 7
```
</solution>
<answer>42</answer>"""

# key -> (parser, well-formed example)
PARSERS = {
    "challenger_math": lambda s: parse_challenger(s, "math"),
    "challenger_math_answer": lambda s: parse_challenger(s, "math", "challenger_math_answer"),
    "challenger_code": lambda s: parse_challenger(s, "code"),
    "planner": parse_planner,
    "critic": parse_critic,
    "solver_math": lambda s: parse_solver(s, "math"),
    "solver_code": lambda s: parse_solver(s, "code"),
}
EXAMPLES = {
    "challenger_math": MATH_OK,
    "challenger_math_answer": "<question>What is 6 * 7?</question>\n<answer>42</answer>",
    "challenger_code": CODE_OK,
    "planner": "<plan>\n1. Multiply 6 by 7.\n2. Check: 42 / 7 = 6.</plan>",
    "critic": "Clear and solvable, if easy; x less than y holds. <score>7</score>",
    "solver_math": "6 * 7 = 42, and 3 is less than 4. <answer>\\boxed{42}</answer>",
    "solver_code": "Add them.\n<answer>\n```python\ndef add(a, b):\n    return a + b if a<3 else b\n```\n</answer>",
}


# ---------------------------------------------------------------------------------------------- well formed
def test_challenger_math_well_formed():
    p = parse_challenger(EXAMPLES["challenger_math"], "math")
    assert p == Parsed({"question": "What is 6 * 7?", "answer": "42", "program": "def solve():\n    return 6 * 7"},
                       1.0, None)
    assert parse_challenger(MATH_OK, "math", "challenger_math") == p


def test_challenger_math_answer_only_well_formed():
    """The paper's answer-only form: no program, and held to its own tags (a <solution> is not required)."""
    text = EXAMPLES["challenger_math_answer"]
    p = parse_challenger(text, "math", "challenger_math_answer")
    assert p == Parsed({"question": "What is 6 * 7?", "answer": "42", "program": None}, 1.0, None)
    # the same reply held to the grounded format misses its program
    grounded = parse_challenger(text, "math")
    assert (grounded.format_reward, grounded.reason, grounded.fields["program"]) == (0.0, "missing <solution>", None)
    # and a grounded reply held to the answer-only format has an unexpected tag
    assert parse_challenger(MATH_OK, "math", "challenger_math_answer").format_reward == 0.0


def test_role_key_picks_the_math_challengers_format():
    assert role_key(Role.CHALLENGER, "math") == "challenger_math"
    assert role_key(Role.CHALLENGER, "math", "program") == "challenger_math"
    assert role_key(Role.CHALLENGER, "math", "answer") == "challenger_math_answer"
    assert role_key(Role.CHALLENGER, "code", "answer") == "challenger_code"
    assert role_key(Role.SOLVER, "math", "answer") == "solver_math"
    assert REQUIRED_TAGS["challenger_math"] == ("question", "solution", "answer")
    assert REQUIRED_TAGS["challenger_math_answer"] == ("question", "answer")


def test_challenger_code_well_formed():
    p = parse_challenger(CODE_OK, "code")
    assert p.format_reward == 1.0 and p.reason is None
    assert p.fields["question"] == "Add two integers."
    assert p.fields["signature"] == "def add(a: int, b: int) -> int"
    assert p.fields["solution"] == "def add(a: int, b: int) -> int:\n    return a + b"
    assert p.fields["entry_point"] == "add"
    assert p.fields["inputs"] == [[1, 2], [-3, 4]]
    assert p.fields["input_errors"] == [] and p.fields["syntax_error"] is None


def test_planner_critic_solver_well_formed():
    assert parse_planner(EXAMPLES["planner"]) == Parsed({"plan": "1. Multiply 6 by 7.\n2. Check: 42 / 7 = 6."}, 1.0)
    assert parse_critic(EXAMPLES["critic"]) == Parsed({"raw": 7, "score": 6 / 9}, 1.0)
    assert parse_solver(EXAMPLES["solver_math"], "math") == Parsed({"answer": "\\boxed{42}"}, 1.0)
    p = parse_solver(EXAMPLES["solver_code"], "code")
    assert p == Parsed({"answer": "def add(a, b):\n    return a + b if a<3 else b"}, 1.0)


def test_tags_are_case_insensitive_ascii_only():
    assert parse_solver("<ANSWER>5</Answer>", "math").format_reward == 1.0
    # U+017F (long s) folds to "s" under Unicode case-insensitivity; it must not make a <score> tag.
    assert parse_critic("<\u017fcore>3</score>").reason == "unbalanced </score> without <score>"


# ---------------------------------------------------------------------------------------------- format reward
@pytest.mark.parametrize("key", list(PARSERS))
def test_empty_completion_scores_half(key):
    for text in ("", "   \n\t "):
        p = PARSERS[key](text)
        assert p.format_reward == 0.5 and p.reason == "empty completion"
    assert parse_critic("").fields == {"raw": None, "score": 0.5}


@pytest.mark.parametrize("key", list(PARSERS))
def test_missing_each_required_tag_scores_zero(key):
    for tag in REQUIRED_TAGS[key]:
        text = re.sub(rf"</?{tag}>", "", EXAMPLES[key])
        p = PARSERS[key](text)
        assert p.format_reward == 0.0 and p.reason == f"missing <{tag}>", (tag, p)


@pytest.mark.parametrize("key", list(PARSERS))
def test_repeated_balanced_tags_score_half(key):
    tag = REQUIRED_TAGS[key][0]
    m = re.search(rf"<{tag}>.*?</{tag}>", EXAMPLES[key], re.S)
    text = EXAMPLES[key] + "\n" + m.group(0)
    p = PARSERS[key](text)
    assert p.format_reward == 0.5 and p.reason == f"repeated <{tag}>"


@pytest.mark.parametrize("key", list(PARSERS))
def test_empty_tag_content_scores_zero(key):
    tag = REQUIRED_TAGS[key][-1]
    text = re.sub(rf"<{tag}>.*?</{tag}>", f"<{tag}> \n </{tag}>", EXAMPLES[key], flags=re.S)
    p = PARSERS[key](text)
    assert p.format_reward == 0.0 and p.reason == f"empty <{tag}>"


def test_unbalanced_nested_and_unexpected_tags_score_zero():
    assert parse_solver("x <answer>42", "math").reason == "unclosed <answer>"
    assert parse_solver("x <answer>42", "math").fields["answer"] == "42"        # lenient content
    assert parse_solver("42</answer>", "math").fields["answer"] == "42"
    p = parse_challenger("<question>Q<answer>1</answer></question>", "math")
    assert p.format_reward == 0.0 and "<answer> inside <question>" in p.reason
    p = parse_planner("<plan>1. do it</plan><answer>3</answer>")
    assert (p.format_reward, p.reason, p.fields["plan"]) == (0.0, "unexpected <answer>", "1. do it")
    assert parse_planner("<plan>a</plan></plan>").format_reward == 0.0


def test_repeated_with_an_empty_copy_scores_zero():
    assert parse_planner("<plan>1. a</plan><plan></plan>").format_reward == 0.0


# ---------------------------------------------------------------------------------------------- critic
@pytest.mark.parametrize("text,raw,score", [
    ("<score>1</score>", 1, 0.0),
    ("<score>10</score>", 10, 1.0),
    ("<score> 4 </score>", 4, 3 / 9),
    ("<score>0.25</score>", None, 0.5),            # a decimal is off the integer scale: neutral
    ("<score>1.0</score>", None, 0.5),             # ... even one that reads as a whole number or a top score
    ("<score>0.9</score>", None, 0.5),
    ("<score>10.0</score>", None, 0.5),
    ("<score>7.</score>", None, 0.5),
    ("<score>11</score>", None, 0.5),              # out of range: neutral
    ("<score>0</score>", None, 0.5),
    ("<score>-3</score>", None, 0.5),
    ("<score>100</score>", None, 0.5),
    ("<score>7/10</score>", 7, 6 / 9),             # an integer out of 10 is read
    ("<score>+5</score>", 5, 4 / 9),
    ("<score>great</score>", None, 0.5),           # unparseable: neutral
    ("I would say 3, no, 10.", 10, 1.0),           # no tag: the last integer 1..10 (MAE)
    ("3, no: 8 out of 10.", 8, 7 / 9),             # ... not the "10" of "out of 10"
    ("I rate it 5/10", 5, 4 / 9),
    ("Maybe 8. Or 12, or 3.5.", 8, 7 / 9),
    ("no number at all", None, 0.5),
])
def test_critic_scores(text, raw, score):
    p = parse_critic(text)
    assert p.fields["raw"] == raw and p.fields["score"] == pytest.approx(score)


_REASONING = ("Step 1: read the question. It asks how long 3 workers take to paint 2 walls at 4 hours a wall, "
              "which is well posed and has one answer. Step 2: check units. The rates are per worker and per wall, so "
              "they agree and the answer is a number of hours. ")


@pytest.mark.parametrize("text", [
    _REASONING + "So the problem has 3",                                       # cut off at max_new_tokens
    _REASONING + "Step 9",
    "The score should be in <score> tags. Step 1 reads 3 numbers and the answer is 7 hours",
    _REASONING + "The score should be in <score> tags. Step 1 reads 3 numbers and the answer is 7 hours",
    _REASONING + "<score>7",                                                   # long reply: no pair, no verdict
])
def test_critic_reasoning_without_a_verdict_is_neutral(text):
    """A reply without a complete <score> pair is read leniently only when it is a short verdict: the numbers
    of reasoning cut off before its verdict (steps, counts, answers) are not a score."""
    assert len(_REASONING) > 200
    p = parse_critic(text)
    assert (p.fields["raw"], p.fields["score"]) == (None, 0.5)
    assert p.format_reward == 0.0                      # the format reward is unchanged: no complete pair


@pytest.mark.parametrize("text,raw", [
    (_REASONING + "So the score is <score>3</score>", 3),   # a complete pair is read however long the reply
    ("<score>7", 7),                                         # a short verdict cut off before its closing tag
    ("Clear and solvable. <score>8/10", 8),
    ("Fine, I would give it a 7.", 7),                       # a one-line verdict without tags (MAE)
])
def test_critic_short_verdicts_and_pairs_are_read(text, raw):
    assert parse_critic(text).fields["raw"] == raw


def test_critic_format_needs_an_integer_score():
    assert parse_critic("<score>0.7</score>").format_reward == 0.0
    assert parse_critic("<score>great</score>").reason == "<score> is not an integer 1..10"
    p = parse_critic("<score>3</score> then <score>9</score>")
    assert (p.format_reward, p.fields["raw"]) == (0.5, 9)


def test_normalise_score():
    assert [normalise_score(n) for n in range(1, 11)] == [pytest.approx((n - 1) / 9) for n in range(1, 11)]
    # only an integer 1..10 is read: a decimal (even one already in [0, 1]), a bool, None or an off-scale
    # number is the neutral 0.5
    for value in (0.3, 0.9, 1.0, 10.0, 0.0, True, False, None, 0, 11, 12, -3):
        assert normalise_score(value) == 0.5, value


# ---------------------------------------------------------------------------------------------- solver / code
def test_solver_math_lenient_boxed_and_nested_braces():
    assert parse_solver("so \\boxed{\\frac{1}{2}} and", "math").fields["answer"] == "\\boxed{\\frac{1}{2}}"
    assert last_boxed("\\boxed{1} then \\boxed{2") == "\\boxed{1}"
    assert parse_solver("no answer here", "math").fields["answer"] is None


def test_solver_code_fallbacks():
    assert parse_solver("```python\ndef f():\n    return 1\n```", "code").fields["answer"] == "def f():\n    return 1"
    assert parse_solver("<answer>def f(): return 2</answer>", "code").fields["answer"] == "def f(): return 2"
    assert parse_solver("<answer>\n```python\ndef f(): return 3", "code").fields["answer"] == "def f(): return 3"
    assert parse_solver("just words", "code").fields["answer"] is None


def test_code_that_does_not_parse_is_kept_and_flagged():
    text = CODE_OK.replace("return a + b", "return a +* (b")
    p = parse_challenger(text, "code")
    assert p.format_reward == 1.0 and p.fields["syntax_error"].startswith("SyntaxError")
    assert p.fields["entry_point"] == "add" and "a +* (b" in p.fields["solution"]
    assert parse_solver("<answer>```python\ndef (((:\n```</answer>", "code").fields["answer"] == "def (((:"


def test_entry_point_and_inputs():
    assert entry_point(None, "import os\nx = 1\ndef first(a):\n    pass\ndef second(): pass") == "first"
    assert entry_point(None, "def broken(:\n  pass") == "broken"
    assert entry_point("add(a, b)", None) is None
    inputs, errors = parse_inputs("[1, 2]\nnot json\n[\"a\", [3]]\n5\n(1, 'x')")
    assert inputs == [[1, 2], ["a", [3]], [5], [1, "x"]]
    assert len(errors) == 1 and errors[0].startswith("line 2")
    assert parse_inputs("[[1, 2],\n [3, 4]]") == ([[1, 2], [3, 4]], [])     # one array of arrays
    assert parse_inputs("```json\n[1]\n[2]\n```") == ([[1], [2]], [])
    assert parse_inputs(None) == ([], [])
    many, errors = parse_inputs("\n".join("[1]" for _ in range(100)))
    assert len(many) == 64 and errors


def test_domain_is_checked():
    with pytest.raises(ValueError, match="domain"):
        parse_solver("x", "poetry")
    assert role_key(Role.SOLVER, "code") == "solver_code" and role_key(Role.CRITIC) == "critic"
    with pytest.raises(ValueError):
        role_key(Role.CHALLENGER)


# ---------------------------------------------------------------------------------------------- garbage
def _garbage(rng: random.Random) -> list[str]:
    odd = "\u0000\u200b\u202e\ufeff\U0001F600\ud800\u00e9\u4e2d\u0301\r\n\t`\\{}[]<>/"
    tags = [f"<{c}{t}>" for t in ("question", "answer", "signature", "solution", "inputs", "plan", "score")
            for c in ("", "/")]
    soup = "".join(rng.choice(tags + ["```python\n", "```", "7", " x ", "def f(:"]) for _ in range(2000))
    return [
        "a" * 10_000,
        "".join(rng.choice(odd) for _ in range(10_000)),
        "".join(chr(rng.randrange(0x20, 0x10FFFF)) for _ in range(10_000)).encode("utf-8", "replace").decode(),
        soup,
        "<answer>" * 3000 + "</answer>" * 2000,
        "[" * 5000 + "]" * 10,
        "<inputs>\n" + "[" * 3000 + "\n" + "(" * 3000 + "\n</inputs>",
        "<solution>\n```python\n" + "(" * 5000 + "\n```\n</solution>",
        "\\boxed{" * 3000,
    ]


def test_garbage_never_raises():
    rng = random.Random(0)
    for text in _garbage(rng):
        for key, parse in PARSERS.items():
            p = parse(text)
            assert p.format_reward in (0.0, 0.5, 1.0), key
            assert (p.format_reward == 1.0) == (p.reason is None), (key, p.reason)
            assert set(p.fields) == set(PARSERS[key]("").fields), key
    assert parse_critic("a" * 10_000).fields["score"] == 0.5


def test_garbage_gives_zero_with_reason():
    p = parse_challenger("\U0001F600" * 5000, "code")
    assert p.format_reward == 0.0 and p.reason.startswith("missing <question>")
    assert p.fields["inputs"] == [] and p.fields["entry_point"] is None


# ---------------------------------------------------------------------------------------------- regexes
# Prose (questions, reasoning, plans, math answers) never holds `<` under constrained decoding; code does,
# as long as it cannot open or close a tag (engines/text/grammar.py, the comment above `_TEXT`).
_PROSE_POOL = list("abcxyzABC0123456789 .,;:!?+-*/=()[]{}'\"\\_^%$#@&|~\n\t`>") + ["\u00e9", "\u4e2d", "\u2211",
                                                                                 "\U0001F600"]
_LT = ["<=", "< ", "<3", "<b", "<x", "a<b", "x <= y"]              # `<` as code uses it
_CODE_POOL = [c for c in _PROSE_POOL if c != "`"] + [" ", "\n"] + _LT
# Random code may hold a string like "\@"; ast.parse (the parser's syntax check) warns about it.
_QUIET_AST = pytest.mark.filterwarnings("ignore:invalid escape sequence")
_LONG_CODE = "if a<b and b <= 3:\n    x = [i for i in range(9) if i<x]  # 1 < 2\n"


def _chunk(rng, n, pool=_PROSE_POOL, first=True):
    """Up to n units of content from pool; a non-space printable-ASCII first character when `first`."""
    k = rng.randint(0, n - 1 if first else n)
    head = rng.choice("abcXYZ0123(+-*") if first else ""
    return head + "".join(rng.choice(pool) for _ in range(k))


def _parts(key: str, rng: random.Random, budget: int | None = None, fill: bool = False) -> list[tuple[str, str]]:
    """A string that `role_regex(key, budget)` matches, as (kind, text) parts: "tag" is fixed syntax, "prose"
    and "field" are bounded parts (at their bound when `fill`), "code" is a code block's body (unbounded in
    the regex; random code runs up to twice the budget's `code` bound, `fill` gives exactly that bound)."""
    b = role_bounds(key, budget)

    def prose(n, first=True):
        return "prose", ("a" * n if fill else _chunk(rng, n, first=first))

    def code():
        return "code", ("c" * b["code"] if fill else _chunk(rng, 2 * b["code"], pool=_CODE_POOL))

    def tag(s):
        return "tag", s

    if key == "critic":
        return [prose(b["reasoning"], first=False), tag(f"<score>{rng.randint(1, 10)}</score>")]
    if key == "planner":
        return [tag("<plan>\n"), prose(b["plan"]), tag("</plan>")]
    if key == "solver_math":
        return [prose(b["reasoning"], first=False), tag("<answer>"), prose(b["answer"]), tag("</answer>")]
    if key == "solver_code":
        return [prose(b["reasoning"], first=False), tag("<answer>\n```python\n"), code(), tag("```\n</answer>")]
    if key == "challenger_math_answer":
        return [tag("<question>"), prose(b["question"]), tag("</question>\n<answer>"), prose(b["answer"]),
                tag("</answer>")]
    if key == "challenger_math":
        return [tag("<question>"), prose(b["question"]), tag("</question>\n<solution>\n```python\ndef solve():\n"),
                code(), tag("```\n</solution>\n<answer>"), prose(b["answer"]), tag("</answer>")]
    if fill:
        name, params, returns = "f" * 30, "p" * b["params"], "r" * 26
        lines = [("field", "1" * (b["input_line"] - 2))] * b["input_lines"]
    else:
        name, returns = "f_1", "dict[str, int]"
        params = rng.choice(["", "x", "a: int, b: list[int]"])
        params = params if len(params) <= b["params"] else "x"
        lines = [("field", f"{rng.randint(-9, 99)}, \"s\"") for _ in range(rng.randint(1, b["input_lines"]))]
    return ([tag("<question>"), prose(b["question"]), tag("</question>\n<signature>def "), ("field", name),
             tag("("), ("field", params), tag(") -> "), ("field", returns),
             tag("</signature>\n<solution>\n```python\n"), code(), tag("```\n</solution>\n<inputs>\n")]
            + [p for line in lines for p in (tag("["), line, tag("]\n"))] + [tag("</inputs>")])


def _join(parts: list[tuple[str, str]], replace: dict[int, str] | None = None) -> str:
    """The string of `parts`, with the text of part i replaced by `replace[i]`."""
    replace = replace or {}
    return "".join(replace.get(i, text) for i, (_, text) in enumerate(parts))


def _example(key: str, rng: random.Random, budget: int | None = None, fill: bool = False) -> str:
    return _join(_parts(key, rng, budget, fill))


def _with_lt(text: str) -> str:
    """`text` with `<b` at its second character: content the old regexes allowed, which prose now may not hold."""
    return text[:1] + "<b" + text[3:]


_CODE_KEYS = ("solver_code", "challenger_code", "challenger_math")   # the formats holding a code block


def _code_field(key: str, text: str) -> str | None:
    """The code block's body as parsed (a grounded math program without its fixed `def solve():` line)."""
    p = PARSERS[key](text)
    if key == "challenger_math":
        program = p.fields["program"]
        assert program.startswith("def solve():\n"), program
        return program.removeprefix("def solve():\n")
    return p.fields["answer"] if key == "solver_code" else p.fields["solution"]


@pytest.mark.parametrize("key", list(ROLE_REGEX))
@_QUIET_AST
def test_strings_matching_role_regex_parse_with_full_format_reward(key):
    rng = random.Random(key)
    samples = [(None, [("tag", EXAMPLES[key])]), (None, _parts(key, rng, fill=True))]
    samples += [(budget, _parts(key, rng, budget)) for budget in (None, 64, 96, 192, 1024) for _ in range(40)]
    codes = []
    for budget, parts in samples:
        s = _join(parts)
        rx = re.compile(role_regex(key, budget))
        assert rx.fullmatch(s), (key, budget, s)
        p = PARSERS[key](s)
        assert p.format_reward == 1.0 and p.reason is None, (key, p.reason, s)
        for i, (kind, text) in enumerate(parts):
            if kind == "prose":                 # no `<` in prose, and the regex refuses one there
                assert "<" not in text, (key, text)
                assert not rx.fullmatch(_join(parts, {i: _with_lt(text)})), (key, budget, text)
            elif kind == "code":
                codes.append((budget, text))
                assert _code_field(key, s) == text.strip(), (key, text)
    if key in _CODE_KEYS:                       # code keeps `<`, and runs past the budget's `code` bound
        for lt in ("<=", "a<b", "<b", "< "):
            assert any(lt in code for _, code in codes), (key, lt)
        assert any(len(code) > role_bounds(key, budget)["code"] for budget, code in codes), key
    else:
        assert not codes


@pytest.mark.parametrize("key", list(ROLE_REGEX))
@pytest.mark.parametrize("budget", [None, 64, 96, 192, 1024])
@_QUIET_AST
def test_role_regex_is_bounded_by_the_token_budget_except_code_blocks(key, budget):
    rng = random.Random(0)
    parts = _parts(key, rng, budget, fill=True)
    longest = _join(parts)
    rx = re.compile(role_regex(key, budget))
    assert rx.fullmatch(longest) and PARSERS[key](longest).format_reward == 1.0
    bounded = [i for i, (kind, _) in enumerate(parts) if kind in ("prose", "field")]
    assert bounded
    for i in bounded:                                        # one more character in any bounded part is too many
        text = parts[i][1]
        assert not rx.fullmatch(_join(parts, {i: text + (text[-1:] or "a")})), (key, budget, i, text)
    if key == "challenger_code":                             # and one more input line
        assert not rx.fullmatch(longest.replace("</inputs>", "[1]\n</inputs>"))
    if budget and budget >= 96:
        assert len(longest) <= budget * 3                    # about CHARS_PER_TOKEN characters per token
    # A code block is not bounded by the regex (the closing fence and the token budget end it): code well
    # past the budget's `code` bound, `<` included, still matches and parses.
    code = [i for i, (kind, _) in enumerate(parts) if kind == "code"]
    assert len(code) == (1 if key in _CODE_KEYS else 0)
    for i in code:
        long_code = _LONG_CODE * (3 * role_bounds(key, budget)["code"] // len(_LONG_CODE) + 1)
        assert len(long_code) > 3 * role_bounds(key, budget)["code"]
        s = _join(parts, {i: long_code})
        assert rx.fullmatch(s) and PARSERS[key](s).format_reward == 1.0, (key, budget)
        assert _code_field(key, s) == long_code.strip()
    for _ in range(30):
        s = _example(key, rng, budget)
        assert rx.fullmatch(s) and PARSERS[key](s).format_reward == 1.0


def _quantified(rx: str) -> list[tuple[int, int, str]]:
    """(start, end, quantifier) for every quantified atom of `rx`, in the regex subset `role_regex` writes:
    the atom `rx[start:end]` is a group `(...)`, a class `[...]`, an escape or one character; the quantifier
    is `*`, `+`, `?` or `{...}`. Escapes and classes are skipped over, so `\\(`, `\\)` and `[^()]` open no group."""
    out, stack, atom, i = [], [], None, 0
    while i < len(rx):
        c = rx[i]
        if c == "\\":
            atom, i = (i, i + 2), i + 2
        elif c == "[":
            j = i + 1
            j += rx[j] == "^"
            j += rx[j] == "]"                       # a `]` first in a class is literal
            while rx[j] != "]":
                j += 2 if rx[j] == "\\" else 1
            atom, i = (i, j + 1), j + 1
        elif c == "(":
            stack.append(i)
            atom, i = None, i + 1 + 2 * rx.startswith("?:", i + 1)
        elif c == ")":
            atom, i = (stack.pop(), i + 1), i + 1
        elif c in "*+?{":
            m = re.compile(r"[*+?]|\{\d*(?:,\d*)?\}").match(rx, i)
            assert m and atom is not None, (rx, i)
            out.append((atom[0], atom[1], m.group(0)))
            atom, i = None, m.end()
        else:
            atom, i = (None if c == "|" else (i, i + 1)), i + 1
    assert not stack, rx
    return out


def _has_alternation(group: str) -> bool:
    """Whether `group` holds a `|` outside escapes and character classes."""
    bare = re.sub(r"\\.", "", group)
    return "|" in re.sub(r"\[\^?\]?[^\]]*\]", "", bare)


def _slow_repetitions(rx: str) -> list[str]:
    """Bounded repetitions `(...|...){m,n}` of a group holding an alternation: the form that costs xgrammar
    ~0.4 s per token on a 49k vocabulary."""
    return [rx[s:e] + q for s, e, q in _quantified(rx)
            if q.startswith("{") and rx[s] == "(" and _has_alternation(rx[s:e])]


def test_guard_finds_bounded_repetitions_of_alternations():
    assert _slow_repetitions(r"[!-;=-~](?:[^<]|<[^</aipqsAIPQS]){0,400}</plan>") == [
        r"(?:[^<]|<[^</aipqsAIPQS]){0,400}"]
    assert _slow_repetitions(r"```python\n(?:[^<`]|<[^</aipqsAIPQS`]){1,90}```") == [
        r"(?:[^<`]|<[^</aipqsAIPQS`]){1,90}"]
    assert _slow_repetitions(r"(?:a(?:b|c)d){2}") == [r"(?:a(?:b|c)d){2}"]
    assert _slow_repetitions(r"x(?:(?:b|c)+){3,}") == [r"(?:(?:b|c)+){3,}"]
    for fine in (r"[^<]{0,400}", r"(?:[^<`]|<[^</`])+```", r"\((?:a|b)\){0,3}", r"[^\n<()|]{0,10}",
                 r"(?:\[[^\n<|]{0,38}\]\n){1,5}", r"(?:10|[1-9])</score>", r"(?: -> [^\n<:]{1,26})?"):
        assert _slow_repetitions(fine) == [], fine


@pytest.mark.parametrize("budget", [None, 64, 192, 1024])
def test_role_regex_has_no_bounded_repetition_of_an_alternation(budget):
    for key in ROLE_REGEX:
        rx = ROLE_REGEX[key] if budget is None else role_regex(key, budget)
        assert _slow_repetitions(rx) == [], (key, budget)
        # Unbounded repetition only for a code block's body, between its fences: the rest is bounded.
        for s, e, q in _quantified(rx):
            if q in ("*", "+") or re.fullmatch(r"\{\d*,\}", q):
                opened = rx[:s].endswith(r"```python\n") or rx[:s].endswith(r"```python\ndef solve\(\):\n")
                assert opened and rx[e + len(q):].startswith("```"), (key, rx[s:e] + q)
    assert ROLE_REGEX == {key: role_regex(key) for key in ROLE_REGEX}


@pytest.fixture(scope="module")
def xgr_compiler():
    xgr = pytest.importorskip("xgrammar")
    from sage.engines.llm.tiny import build_tokenizer

    tok = build_tokenizer()
    return xgr, xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)))


def _accepts(xgr, compiled, s: str) -> bool:
    m = xgr.GrammarMatcher(compiled)
    return m.accept_string(s) and m.is_completed()


@pytest.mark.parametrize("key", list(ROLE_REGEX))
def test_role_regex_compiles_in_xgrammar_and_agrees_with_re(key, xgr_compiler):
    xgr, compiler = xgr_compiler
    compiled = compiler.compile_regex(ROLE_REGEX[key])
    rng = random.Random(1)
    for s in [EXAMPLES[key], _example(key, rng, fill=True)] + [_example(key, rng) for _ in range(15)]:
        assert _accepts(xgr, compiled, s), (key, s)
    bad = [EXAMPLES[key][:-3], EXAMPLES[key] + "x", "", "<score>11</score>", "hello"]
    parts = _parts(key, rng)
    for i, (kind, text) in enumerate(parts):
        if kind == "prose":
            bad.append(_join(parts, {i: _with_lt(text)}))                  # `<` in prose
        elif kind == "code":
            bad.append(_join(parts, {i: text + "\n# </answer>\n"}))      # a tag inside code
            good = _join(parts, {i: _LONG_CODE * 3})                       # `<` in code, past the old bound
            assert _accepts(xgr, compiled, good) and re.fullmatch(ROLE_REGEX[key], good), (key, good)
    for s in bad:
        assert not _accepts(xgr, compiled, s) and not re.fullmatch(ROLE_REGEX[key], s), (key, s)
    tight = compiler.compile_regex(role_regex(key, 96))
    assert _accepts(xgr, tight, _example(key, rng, 96, fill=True))


def test_regex_prose_holds_no_lt_and_code_cannot_open_a_tag():
    rx = re.compile(ROLE_REGEX["solver_math"])
    assert not rx.fullmatch("<plan>x</plan><answer>1</answer>")
    assert not rx.fullmatch("a <Score> <answer>1</answer>")
    for prose in ("a <b and a<=3 ", "3 < 4", "x<y", "<"):                  # any `<` in prose is refused
        assert not rx.fullmatch(prose + "<answer>1</answer>"), prose
        assert not rx.fullmatch("a <answer>" + prose + "</answer>"), prose
    assert rx.fullmatch("a less than b and a at most 3 <answer>1</answer>")
    assert not re.fullmatch(ROLE_REGEX["planner"], "<plan>\n1. check a<b</plan>")
    assert not re.fullmatch(ROLE_REGEX["critic"], "fine, x <= y <score>5</score>")
    assert not re.fullmatch(ROLE_REGEX["challenger_math_answer"],
                            "<question>Is 3<4?</question>\n<answer>yes</answer>")
    assert re.fullmatch(ROLE_REGEX["challenger_math_answer"],
                        "<question>Is 3 less than 4?</question>\n<answer>yes</answer>")
    assert not re.fullmatch(ROLE_REGEX["challenger_math"], MATH_OK.replace("6 * 7?", "6<7?"))
    assert re.fullmatch(ROLE_REGEX["challenger_math"],
                        MATH_OK.replace("6 * 7\n", "6 * 7 if 6<7 else 0\n"))
    # the program is the `solve()` the sandbox calls: another function name does not match
    assert not re.fullmatch(ROLE_REGEX["challenger_math"], MATH_OK.replace("def solve", "def answer"))

    def solver(code):
        return "Code.\n<answer>\n```python\n" + code + "```\n</answer>"

    def challenger(code):
        return CODE_OK.replace("def add(a: int, b: int) -> int:\n    return a + b\n", code)

    for build, key in ((solver, "solver_code"), (challenger, "challenger_code")):
        crx = re.compile(ROLE_REGEX[key])
        assert crx.fullmatch(build("def add(a, b):\n    return a + b\n"))
        for code in ("def f(a, b):\n    return a<b and a <= 3 or b< 2\n", "x = 1 <3\n", "y = [i for i in r if i<x]\n"):
            s = build(code)
            assert crx.fullmatch(s) and PARSERS[key](s).format_reward == 1.0, (key, code)
            assert _code_field(key, s) == code.strip()
        for closer in ("</answer>", "</solution>", "</inputs>", "</x>", "<answer>", "<plan>", "<Score>", "<s"):
            assert not crx.fullmatch(build(f"x = 1\n# {closer}\n")), (key, closer)
        assert not crx.fullmatch(build("x = `1`\n"))                     # a backtick would close the fence
