"""Prompt templates: every kind renders its fields and a worked example (as an earlier turn, or inline for the
Critic) that parses with full format reward and fits the role's constraint, and has its own version, a hash of
its text; fields are cut to the tokens the context leaves."""

from __future__ import annotations

import dataclasses
import re

import pytest
from transformers import AutoTokenizer

from sage.engines.text.tags import parse_challenger, parse_critic, parse_planner, parse_solver, role_key, role_regex
from sage.stages import prompts
from sage.stages.prompts import (
    KINDS,
    MAX_FIELD_CHARS,
    MIN_FIELD_TOKENS,
    SYSTEM,
    TEMPLATE_VERSION,
    TEMPLATES,
    field_limit,
    render,
    template_version,
)

EXPECTED_KINDS = {"challenger_math", "challenger_code", "critic_question", "critic_plan", "planner",
                  "solver_math", "solver_code", "solver_math_plan", "solver_code_plan"}
INLINE = {"critic_question", "critic_plan"}         # the Critic's example stays inline (see the module doc)
TAGS = {"challenger_math": ["question", "answer"], "challenger_code": ["question", "signature", "solution", "inputs"],
        "critic_question": ["score"], "critic_plan": ["score"], "planner": ["plan"]}
TAGS.update({k: ["answer"] for k in EXPECTED_KINDS if k.startswith("solver")})
QUESTION = "QUESTION-TEXT {{plan}} \\boxed{x} $5"


def _fields(kind):
    f = {"question": QUESTION}
    if "plan" in TEMPLATES[kind].required:
        f["plan"] = "PLAN-TEXT"
    return f


def _example_reply(kind) -> str:
    msgs = render(kind, **_fields(kind))
    if kind in INLINE:
        return msgs[-1]["content"].split("Example reply:\n")[-1]
    return msgs[-2]["content"]


def test_kinds_and_versions():
    assert set(KINDS) == EXPECTED_KINDS == set(TEMPLATE_VERSION)
    assert len(set(TEMPLATE_VERSION.values())) == len(KINDS)
    for kind, version in TEMPLATE_VERSION.items():
        assert re.fullmatch(rf"{kind}@[0-9a-f]{{10}}", version)


@pytest.mark.parametrize("part", ["system", "user", "reply", "example", "optional"])
def test_editing_any_part_of_a_template_changes_its_version_and_the_row_ids(part, monkeypatch):
    from sage.stages.rollouts import Unit

    t = TEMPLATES["planner"]
    edited = {"system": dict(system=t.system + " "), "user": dict(user=t.user.replace("short", "brief")),
              "reply": dict(reply=t.reply + "\n"), "example": dict(example={"question": "another"}),
              "optional": dict(optional=())}[part]
    assert template_version(dataclasses.replace(t, **edited)) != TEMPLATE_VERSION["planner"]
    assert template_version(dataclasses.replace(t)) == TEMPLATE_VERSION["planner"]   # same text, same version

    class Ctx:
        run_id, iteration = "r", 1
    unit = Unit("planner", "q1", "math", {"question": "x"})
    before = unit.rollout_id(Ctx, "plan", 0)
    monkeypatch.setitem(prompts.TEMPLATE_VERSION, "planner", template_version(dataclasses.replace(t, **edited)))
    assert unit.rollout_id(Ctx, "plan", 0) != before


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def _tokens(tokenizer, messages) -> int:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("kind", ["solver_code_plan", "critic_plan", "challenger_math"])
def test_fields_are_cut_in_tokens_to_what_the_context_leaves(kind, tokenizer):
    max_len, new = 1024, 200
    limit = field_limit(kind, tokenizer, max_len, new)
    long = {f: " ".join(f"w{i}" for i in range(3000)) for f in TEMPLATES[kind].required}
    if "signature" in TEMPLATES[kind].optional:
        long["signature"] = "def f(" + ", ".join(f"a{i}" for i in range(900)) + ")"
    cut = render(kind, limit, **long)
    assert " ..." in cut[-1]["content"]
    assert _tokens(tokenizer, cut) + new <= max_len                      # the completion still fits
    assert _tokens(tokenizer, cut) + new > max_len - 60 * (len(long) + 1)  # and the fields use the room
    short = {f: "a short field" for f in long}
    assert render(kind, limit, **short) == render(kind, **short)          # what fits is not touched
    # A longer context gives each field more tokens.
    assert field_limit(kind, tokenizer, 4 * max_len, new).tokens > limit.tokens


def test_a_context_too_small_for_the_template_keeps_a_floor(tokenizer):
    assert field_limit("planner", tokenizer, 300, 290).tokens == MIN_FIELD_TOKENS
    assert field_limit("planner", None, 300, 290) is None                # no tokenizer: the character cut


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_every_kind_renders(kind):
    msgs = render(kind, **_fields(kind))
    roles = ["system", "user"] if kind in INLINE else ["system", "user", "assistant", "user"]
    assert [m["role"] for m in msgs] == roles and all(m["content"] for m in msgs)
    task = msgs[-1]["content"]
    assert QUESTION in task and all(QUESTION not in m["content"] for m in msgs[:-1])   # verbatim, last turn only
    assert ("PLAN-TEXT" in task) == ("plan" in TEMPLATES[kind].required)
    assert all("{{" not in m["content"].replace("{{plan}}", "") for m in msgs)
    assert sum(len(m["content"]) for m in msgs) < 2000                # short: a 135M model with 2048 tokens
    for tag in TAGS[kind]:
        assert f"<{tag}>" in task and f"</{tag}>" in task


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS - INLINE))
def test_example_turn_is_the_same_template_and_nothing_is_inline(kind):
    system, example, reply, task = render(kind, **_fields(kind))
    assert system["content"] == SYSTEM
    assert "Example" not in task["content"]                         # nothing after the task to copy
    # The example's task is the template filled with other fields: the instructions are word for word the same.
    blank = render(kind, **{k: "" for k in _fields(kind)} | {"question": " "})[-1]["content"]
    for line in blank.splitlines():
        if line.strip() and "Function:" not in line:
            assert line in example["content"], (kind, line)


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_worked_example_parses_with_full_format_reward_and_fits_the_constraint(kind):
    reply = _example_reply(kind)
    role, domain = kind.split("_")[0], "code" if "code" in kind else "math"
    parse = {"challenger": lambda s: parse_challenger(s, domain), "critic": parse_critic,
             "planner": parse_planner, "solver": lambda s: parse_solver(s, domain)}[role]
    assert parse(reply).format_reward == 1.0, (kind, reply)
    # Under `constrain: true` the model can write exactly what the example shows.
    key = role_key(role, domain if role in ("challenger", "solver") else None)
    assert re.fullmatch(role_regex(key), reply), (kind, reply)


@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS))
def test_no_placeholder_for_the_model_to_copy(kind):
    # SmolLM2-135M wrote "\boxed{...}" literally when the Solver's prompt showed it
    for m in render(kind, **_fields(kind)):
        assert "..." not in m["content"], (kind, m["content"])


def test_the_code_solver_example_starts_with_the_answer_tag():
    # A fence opened before <answer> turns the code's first `<` into the tag under the constraint regex
    assert _example_reply("solver_code").startswith("<answer>\n```python\n")
    assert _example_reply("solver_code_plan").startswith("<answer>\n```python\n")


def test_signature_is_optional_for_code_and_errors_are_clear():
    assert "Function: def add(a, b)" in render("solver_code", question="Add.", signature="def add(a, b)")[-1]["content"]
    assert "Function:" not in render("solver_code", question="Add.")[-1]["content"]
    with pytest.raises(ValueError, match="unknown prompt kind"):
        render("poet", question="x")
    with pytest.raises(ValueError, match=r"missing \['plan'\]"):
        render("critic_plan", question="x")
    with pytest.raises(ValueError, match=r"unexpected \['plan'\]"):
        render("solver_math", question="x", plan="y")


def test_long_fields_are_clipped():
    user = render("planner", question="x" * 20_000)[-1]["content"]
    assert "x" * MAX_FIELD_CHARS + " ..." in user and "x" * (MAX_FIELD_CHARS + 1) not in user
