"""Prompt templates: every kind renders its fields and a worked example (as an earlier turn, or inline for the
Critic) that parses with full format reward and fits the role's constraint, and has its own version, a hash of
its text; fields are cut to the tokens the context leaves."""

from __future__ import annotations

import dataclasses
import re

import pytest
from transformers import AutoTokenizer

from sage.configs import load_config
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

EXPECTED_KINDS = {"challenger_math", "challenger_math_answer", "challenger_code", "critic_question", "critic_plan",
                  "planner", "solver_math", "solver_code", "solver_math_plan", "solver_code_plan"}
INLINE = {"critic_question", "critic_plan"}         # the Critic's example stays inline (see the module doc)
TAGS = {"challenger_math": ["question", "solution", "answer"], "challenger_math_answer": ["question", "answer"],
        "challenger_code": ["question", "signature", "solution", "inputs"],
        "critic_question": ["score"], "critic_plan": ["score"], "planner": ["plan"]}
TAGS.update({k: ["answer"] for k in EXPECTED_KINDS if k.startswith("solver")})
QUESTION = "QUESTION-TEXT {{plan}} \\boxed{x} $5"


def _fields(kind):
    f = {"question": QUESTION}
    if "plan" in TEMPLATES[kind].required:
        f["plan"] = "PLAN-TEXT"
    return f


def _example_reply(kind, family: str | None = None) -> str:
    msgs = render(kind, family=family, **_fields(kind))
    if kind in INLINE:
        return msgs[-1]["content"].split("Example reply:\n")[-1]
    return msgs[-2]["content"]


# every (kind, family) with a worked example of its own (the grounded math Challenger's seed families)
FAMILY_EXAMPLES = [(kind, family) for kind in sorted(TEMPLATES) for family in sorted(TEMPLATES[kind].examples)]


def test_kinds_and_versions():
    assert set(KINDS) == EXPECTED_KINDS == set(TEMPLATE_VERSION)
    assert len(set(TEMPLATE_VERSION.values())) == len(KINDS)
    for kind, version in TEMPLATE_VERSION.items():
        assert re.fullmatch(rf"{kind}@[0-9a-f]{{10}}", version)


def test_editing_a_family_example_changes_the_version():
    t = TEMPLATES["challenger_math"]
    family, (fields, reply) = sorted(t.examples.items())[0]
    for examples in ({**t.examples, family: (fields, reply + "\n")}, {**t.examples, family: ({"question": "x"}, reply)},
                     {k: v for k, v in t.examples.items() if k != family}, {**t.examples, "other": (fields, reply)}):
        assert template_version(dataclasses.replace(t, examples=examples)) != TEMPLATE_VERSION["challenger_math"]
    assert template_version(dataclasses.replace(t, examples=dict(t.examples))) == TEMPLATE_VERSION["challenger_math"]


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
        run_id, iteration, cfg = "r", 1, load_config("cpu")
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


# the grounded math Challenger's template and worked example alone take ~890 tiny-model tokens: a 1024 context
# leaves it no room beyond the floor, so it is checked with twice that
@pytest.mark.parametrize("kind,max_len", [("solver_code_plan", 1024), ("critic_plan", 1024),
                                          ("challenger_math_answer", 1024), ("challenger_math", 2048)])
def test_fields_are_cut_in_tokens_to_what_the_context_leaves(kind, max_len, tokenizer):
    new = 200
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


@pytest.mark.parametrize("kind,family", [(k, None) for k in sorted(EXPECTED_KINDS)] + FAMILY_EXAMPLES)
def test_worked_example_parses_with_full_format_reward_and_fits_the_constraint(kind, family):
    reply = _example_reply(kind, family)
    role, domain = kind.split("_")[0], "code" if "code" in kind else "math"
    # the format a reply is held to: a Challenger's is its prompt kind (the two math kinds differ)
    key = kind if role == "challenger" else role_key(role, domain if role == "solver" else None)
    parse = {"challenger": lambda s: parse_challenger(s, domain, key), "critic": parse_critic,
             "planner": parse_planner, "solver": lambda s: parse_solver(s, domain)}[role]
    parsed = parse(reply)
    assert parsed.format_reward == 1.0 and parsed.reason is None, (kind, family, reply)
    # Under `constrain: true` the model can write exactly what the example shows.
    assert re.fullmatch(role_regex(key), reply), (kind, family, reply)
    if key == "challenger_math":     # and the worked example is itself grounded: a program, from its own numbers
        from sage.engines.text.arithmetic import number_mismatch

        program, question = parsed.fields["program"], parsed.fields["question"]
        assert program and program.startswith("def solve():"), (family, program)
        assert number_mismatch(program, question) is None, (family, program)
        namespace: dict = {}
        exec(program, namespace)     # the examples' own fixed text, not model output
        assert str(namespace["solve"]()) == parsed.fields["answer"], (family, program)


@pytest.mark.parametrize("kind,family", FAMILY_EXAMPLES)
def test_a_family_gets_its_own_worked_example(kind, family):
    fields, reply = TEMPLATES[kind].examples[family]
    msgs = render(kind, family=family, **_fields(kind))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert fields["question"] in msgs[1]["content"] and msgs[2]["content"] == reply
    assert QUESTION in msgs[-1]["content"] and msgs[-1] == render(kind, **_fields(kind))[-1]   # the same task
    assert msgs[2]["content"] != _example_reply(kind)                       # not the default example
    assert sum(len(m["content"]) for m in msgs) < 2000
    # and the example's new question is of the reference's kind, with other numbers
    new_question = parse_challenger(reply, "math", kind).fields["question"]
    assert new_question != fields["question"]


def test_the_gcd_family_shows_the_gcd_example_and_others_the_default():
    gcd = render("challenger_math", family="reasoning_gym:gcd", question="Find the GCD of 8, 12.")
    assert "Greatest Common Divisor" in gcd[1]["content"] and "math.gcd(24, 36)" in gcd[2]["content"]
    assert "<answer>12</answer>" in gcd[2]["content"]
    for family in (None, "challenger", "reasoning_gym:unknown_family", "human_eval:HumanEval/0"):
        msgs = render("challenger_math", family=family, question="Find the GCD of 8, 12.")
        assert msgs[:3] == render("challenger_math", question="Find the GCD of 8, 12.")[:3]
        assert "Greatest Common Divisor" not in msgs[1]["content"] + msgs[2]["content"]
    # the answer-only kind has no family examples: the family changes nothing
    assert not TEMPLATES["challenger_math_answer"].examples
    assert render("challenger_math_answer", family="reasoning_gym:gcd", question="x") == \
        render("challenger_math_answer", question="x")


def test_a_family_example_is_counted_in_the_field_limit(tokenizer):
    max_len, new = 2048, 200
    limit = field_limit("challenger_math", tokenizer, max_len, new)
    long = " ".join(f"w{i}" for i in range(3000))
    for family in [None, *TEMPLATES["challenger_math"].examples]:
        cut = render("challenger_math", limit, family=family, question=long)
        assert _tokens(tokenizer, cut) + new <= max_len, family


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


def test_prompt_kinds_are_the_templates_of_every_set_and_name_their_role():
    from sage.configs.names import Role
    from sage.stages.prompts import PROMPT_SETS, PromptKind
    from sage.stages.rollouts import Unit

    assert all(set(templates) == set(PromptKind) for templates in PROMPT_SETS.values())
    assert PromptKind.solver("code", plan=True) == "solver_code_plan" and PromptKind.solver("math") == "solver_math"
    assert PromptKind.challenger("math", "answer") == "challenger_math_answer"
    assert [PromptKind.challenger(d, "program") for d in ("math", "code")] == ["challenger_math", "challenger_code"]
    kinds = (PromptKind.CHALLENGER_CODE, PromptKind.CRITIC_PLAN, PromptKind.PLANNER, PromptKind.SOLVER_MATH_PLAN)
    assert [k.role for k in kinds] == [Role.CHALLENGER, Role.CRITIC, Role.PLANNER, Role.SOLVER]
    assert {k.role for k in PromptKind} == set(Role)
    assert [k for k in PromptKind if k.shows_plan] == ["solver_math_plan", "solver_code_plan"]
    with pytest.raises(ValueError, match="no prompt kind 'solver_chess': the domain must be 'math' or 'code'"):
        PromptKind.solver("chess")
    with pytest.raises(ValueError, match="'solver_chess' is not a valid PromptKind"):
        Unit("solver_chess", "q1", "math", {})
