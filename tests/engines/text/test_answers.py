"""Final-answer extraction: the one brace matcher behind `last_boxed` (the Solver parser's fallback) and
`extract_answer` (what the verify and evaluate stages hand the math checker), and where the two differ."""

from __future__ import annotations

import pytest

from sage.engines.text.answers import BOXED_OR_FBOX, extract_answer, hedged, last_boxed
from sage.engines.text.tags import parse_solver

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("text,answer", [
    ("so \\boxed{\\frac{1}{2}} and finally \\boxed{x^{2}}", "x^{2}"),
    ("\\boxed{\\{1, \\{2\\}\\}}", "\\{1, \\{2\\}\\}"),
    ("\\boxed{3} then \\boxed{4", "3"),
    ("\\fbox{7}", "7"),
    ("<answer>42</answer>", "42"),
    ("<answer>first</answer> ... <answer> \\boxed{5} </answer>", "5"),
    ("<answer>a</answer><answer>b</answer>", "b"),
    ("Thus the answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
    ("The final answer is: 12\nThanks", "12"),
    ("no answer here", None),
    ("", None),
    (None, None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("text,boxed,answer", [
    # nesting: the box that opens last wins, so of nested boxes the inner one
    ("\\boxed{\\boxed{1}+1}", "\\boxed{1}", "1"),
    ("\\boxed{a \\fbox{b}}", "\\boxed{a \\fbox{b}}", "b"),
    # unbalanced: an unclosed box gives way to the last closed one before it
    ("\\boxed{1} then \\boxed{2", "\\boxed{1}", "1"),
    ("\\boxed{1} \\boxed{ {2}", "\\boxed{1}", "1"),
    ("\\boxed{1}} \\boxed{2}}", "\\boxed{2}", "2"),
    ("\\boxed{2", None, None),
    # escaped braces count as braces, so they must balance too
    ("\\boxed{\\{1\\}}", "\\boxed{\\{1\\}}", "\\{1\\}"),
    # an empty last box: no boxed answer, so extraction moves on to the tag
    ("\\boxed{3} \\boxed{ } <answer>5</answer>", "\\boxed{ }", "5"),
    # only `\\boxed{` opens a box: no space, no other command
    ("\\boxed {4}", None, None),
    ("\\boxedx{4}", None, None),
])
def test_one_brace_matcher(text, boxed, answer):
    assert last_boxed(text) == boxed
    assert extract_answer(text) == answer


def test_fbox_counts_for_extraction_only():
    """The Solver parser falls back on `\\boxed{}` alone (kept as written); `extract_answer` also takes `\\fbox{}`."""
    text = "so \\boxed{1} and then \\fbox{2}"
    assert last_boxed(text) == "\\boxed{1}" and last_boxed(text, BOXED_OR_FBOX) == "\\fbox{2}"
    assert extract_answer(text) == "2"
    assert parse_solver(text, "math").fields["answer"] == "\\boxed{1}"
    assert parse_solver("only \\fbox{7}", "math").fields["answer"] is None
    assert extract_answer("only \\fbox{7}") == "7"


@pytest.mark.parametrize("text,answer", [
    # listed boxes are one answer, as math-verify reads them
    ("The solutions are \\boxed{3} and \\boxed{4}.", "3, 4"),
    ("\\boxed{-1}, \\boxed{1}", "-1, 1"),
    ("x = \\boxed{2} or x = \\boxed{5}", "2, 5"),
    ("x_1 = \\boxed{2}; x_2 = \\boxed{5}", "2, 5"),
    ("$\\boxed{3}$ and $\\boxed{4}$", "3, 4"),
    ("\\(\\boxed{1}\\) and \\(\\boxed{-2}\\)", "1, -2"),
    ("\\boxed{1}\\boxed{2}\\boxed{3}", "1, 2, 3"),
    # a box repeated counts once
    ("\\boxed{5} \\boxed{5}", "5"),
    ("\\boxed{5}\n\n**Final Answer**\n\\boxed{5}", "5"),
    # words between boxes: the last one
    ("First I got \\boxed{3}, but that was wrong. The answer is \\boxed{4}.", "4"),
    ("so \\boxed{1} and then \\boxed{2}", "2"),
    ("a = \\boxed{2}, hence b = \\boxed{5}", "5"),
    # an empty box ends the list
    ("\\boxed{3} and \\boxed{} and \\boxed{4}", "4"),
])
def test_repeated_and_listed_boxes(text, answer):
    assert extract_answer(text) == answer


def test_many_listed_boxes_in_one_pass():
    """Listing is followed box by box through the closing order, not by rescanning: 20,000 boxes stay fast."""
    assert extract_answer("\\boxed{1}, " * 20000) == "1"
    assert extract_answer(", ".join(f"\\boxed{{{i}}}" for i in range(20000))).count(",") == 19999


@pytest.mark.parametrize("text", ["The final answer is: ", "{\nthe answer is \n ", "the answer is $$."])
def test_answer_is_with_nothing_after_it(text):
    """A completion cut off right after "the answer is" has no answer (this used to raise IndexError)."""
    assert extract_answer(text) is None


def test_many_unclosed_boxes():
    text = "\\boxed{" * 20000 + "x" + "{" * 20000
    assert last_boxed(text) is None and extract_answer(text) is None
    assert extract_answer("\\boxed{" * 20000 + "\\boxed{7}") == "7"


@pytest.mark.parametrize("answer,refused", [
    # a negation, a bound, a bare relation, a remark naming another value: more than one candidate
    ("not 3", True), ("anything but 3", True), ("3 is not the answer", True), ("\\text{not } 3", True),
    ("4, not 3", True), ("3, not 4", True), ("It is 4 (I first thought 3)", True), ("at least 3", True),
    ("at most 3", True), ("No, 3", True), ("\\geq 3", True), ("> 3", True), ("\\neg 3", True), ("maybe 3", True),
    ("Not 3. Thanks.", True), ("3. I am not sure.", True),
    # one value, however it is written
    ("3", False), ("x \\geq 3", False), ("x \\notin \\{3\\}", False), ("\\left(\\frac{1}{2}\\right)", False),
    ("f(1) = 1", False), ("No.", False), ("There are no solutions.", False), ("So he needs 100 more dollars.", False),
    ("\\boxed{7} \\quad \\text{(checked by substitution)}", False), ("12 \\text{ (in cm}^2)", False),
    ("12 (in cm^{2})", False),
    ("3 (or 4)", True), ("It is 4 (first 13)", True),
    # rejected values in the reasoning before the final sentence do not count
    ("There are $6! = 720$ arrangements, but half are repeats, so 360.", False),
    ("We test 4: not a root. Trying 5 works.\nSo x = 5.", False),
    ("", False), (None, False),
])
def test_hedged(answer, refused):
    assert hedged(answer) is refused
