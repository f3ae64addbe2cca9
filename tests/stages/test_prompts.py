"""Prompt templates: every kind renders, carries its fields and a worked example, and has its own version."""

from __future__ import annotations

import re

import pytest

from engines.tags import parse_challenger, parse_critic, parse_planner, parse_solver
from stages.prompts import KINDS, MAX_FIELD_CHARS, TEMPLATE_VERSION, TEMPLATES, render

EXPECTED_KINDS = {"challenger_math", "challenger_code", "critic_question", "critic_plan", "planner",
                  "solver_math", "solver_code", "solver_math_plan", "solver_code_plan"}
TAGS = {"challenger_math": ["question", "answer"], "challenger_code": ["question", "signature", "solution", "inputs"],
        "critic_question": ["score"], "critic_plan": ["score"], "planner": ["plan"]}
TAGS.update({k: ["answer"] for k in EXPECTED_KINDS if k.startswith("solver")})


def _fields(kind):
    f = {"question": "QUESTION-TEXT {{plan}} \\boxed{x} $5"}
    if "plan" in TEMPLATES[kind].required:
        f["plan"] = "PLAN-TEXT"
    return f


def test_kinds_and_versions():
    assert set(KINDS) == EXPECTED_KINDS == set(TEMPLATE_VERSION)
    assert len(set(TEMPLATE_VERSION.values())) == len(KINDS)
    for kind, version in TEMPLATE_VERSION.items():
        assert re.fullmatch(rf"{kind}@\d+", version)


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_every_kind_renders(kind):
    msgs = render(kind, **_fields(kind))
    assert [m["role"] for m in msgs] == ["system", "user"] and all(m["content"] for m in msgs)
    user = msgs[1]["content"]
    assert "QUESTION-TEXT {{plan}} \\boxed{x} $5" in user            # inserted verbatim, not re-substituted
    assert ("PLAN-TEXT" in user) == ("plan" in TEMPLATES[kind].required)
    assert "{{" not in user.replace("{{plan}}", "")
    assert len(user) < 1500                                         # short: a 135M model with 2048 tokens
    for tag in TAGS[kind]:
        assert f"<{tag}>" in user and f"</{tag}>" in user


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_worked_example_parses_with_full_format_reward(kind):
    user = render(kind, **_fields(kind))[1]["content"]
    example = user.split("Example reply:\n" if "Example reply:" in user else "Example:\n")[-1]
    domain = "code" if "code" in kind else "math"
    parse = {"challenger": lambda s: parse_challenger(s, domain), "critic": parse_critic,
             "planner": parse_planner, "solver": lambda s: parse_solver(s, domain)}[kind.split("_")[0]]
    assert parse(example).format_reward == 1.0, (kind, example)


def test_signature_is_optional_for_code_and_errors_are_clear():
    assert "Function: def add(a, b)" in render("solver_code", question="Add.", signature="def add(a, b)")[1]["content"]
    assert "Function:" not in render("solver_code", question="Add.")[1]["content"]
    with pytest.raises(ValueError, match="unknown prompt kind"):
        render("poet", question="x")
    with pytest.raises(ValueError, match=r"missing \['plan'\]"):
        render("critic_plan", question="x")
    with pytest.raises(ValueError, match=r"unexpected \['plan'\]"):
        render("solver_math", question="x", plan="y")


def test_long_fields_are_clipped():
    user = render("planner", question="x" * 20_000)[1]["content"]
    assert "x" * MAX_FIELD_CHARS + " ..." in user and "x" * (MAX_FIELD_CHARS + 1) not in user
