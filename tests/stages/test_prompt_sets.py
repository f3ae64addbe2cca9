"""The two prompt sets (`roles.prompts`): every kind of both renders, and a reply written in the format its prompt
asks for (reasoning first under `reasoning`) parses with full format reward with the existing parsers; the `short`
set, cpu.yaml's, is byte for byte what it was before the `reasoning` set existed; the stages render the set the
config names and give its rows their own ids."""

from __future__ import annotations

import re

import pytest

from sage.configs import load_config
from sage.engines.text.tags import parse_challenger, parse_critic, parse_planner, parse_solver, role_key
from sage.stages.prompts import KINDS, PROMPT_SETS, TEMPLATE_VERSION, VERSIONS, field_limit, render, version

pytestmark = pytest.mark.fast

# The `short` set's versions before the `reasoning` set was added: each hashes every character its kind puts in a
# prompt (system, task, worked example), so equal versions are byte-identical prompts and unchanged row ids.
SHORT_BEFORE = {
    "challenger_math": "challenger_math@f49245d601", "challenger_math_answer": "challenger_math_answer@10d8148626",
    "challenger_code": "challenger_code@959ca5d19b", "critic_question": "critic_question@b0201b5edf",
    "critic_plan": "critic_plan@572df605da", "planner": "planner@dcf513ae0f", "solver_math": "solver_math@e4a6f70d61",
    "solver_code": "solver_code@9ed86d6c89", "solver_math_plan": "solver_math_plan@3e794d9712",
    "solver_code_plan": "solver_code_plan@4611b736af"}

# A reply in the format each reasoning prompt asks for: reasoning, then the tags.
REASONED = {
    "challenger_math": "The reference adds two numbers; I ask for a product. 7 * 8 = 56.\n<question>What is 7 * 8?"
                       "</question>\n<solution>\n```python\ndef solve():\n    return 7 * 8\n```\n</solution>\n"
                       "<answer>56</answer>",
    "challenger_math_answer": "The reference adds; I multiply instead: 7 * 8 = 56.\n<question>What is 7 * 8?"
                              "</question>\n<answer>56</answer>",
    "challenger_code": "The reference reverses a list; the new task sums one, the empty list is the edge case.\n"
                       "<question>Return the sum of a list.</question>\n<signature>def total(xs: list) -> int"
                       "</signature>\n<solution>\n```python\ndef total(xs):\n    return sum(xs)\n```\n</solution>\n"
                       "<inputs>\n[[1, 2]]\n[[]]\n[[5]]\n</inputs>",
    "critic_question": "All quantities are given; solving it takes one step, so it is easy. <score>5</score>",
    "critic_plan": "Step 1 reads the numbers and step 2 adds them: correct and complete. <score>9</score>",
    "planner": "The answer needs the two numbers and one sum.\n<plan>\n1. Read the numbers.\n2. Add them.\n</plan>",
    "solver_math": "First, 2 + 3 = 5. Then 5 * 4 = 20.\n<answer>\\boxed{20}</answer>",
    "solver_code": "Sum the list with the built-in; an empty list gives 0.\n<answer>\n```python\ndef total(xs):\n"
                   "    return sum(xs)\n```\n</answer>",
}
REASONED["solver_math_plan"], REASONED["solver_code_plan"] = REASONED["solver_math"], REASONED["solver_code"]


def _fields(kind: str) -> dict:
    fields: dict = {"question": "What is (2 + 3) * 4?"}
    if kind.endswith("plan") and kind != "planner":
        fields["plan"] = "1. Add.\n2. Multiply."
    return fields


def _parse(kind: str, text: str):
    role, domain = kind.split("_")[0], "code" if "code" in kind else "math"
    key = kind if role == "challenger" else role_key(role, domain if role == "solver" else None)
    return {"challenger": lambda s: parse_challenger(s, domain, key), "critic": parse_critic,
            "planner": parse_planner, "solver": lambda s: parse_solver(s, domain)}[role](text)


def test_the_short_set_is_what_it_was_and_the_reasoning_set_is_another():
    assert TEMPLATE_VERSION == VERSIONS["short"] == SHORT_BEFORE
    assert set(PROMPT_SETS["reasoning"]) == set(KINDS)
    assert {version(k, "reasoning") for k in KINDS}.isdisjoint(SHORT_BEFORE.values())   # rows of each set: own ids
    assert all(re.fullmatch(rf"{k}@[0-9a-f]{{10}}", version(k, "reasoning")) for k in KINDS)
    for kind in KINDS:   # render's default is the short set
        assert render(kind, **_fields(kind)) == render(kind, prompt_set="short", **_fields(kind))


@pytest.mark.parametrize("prompt_set", ["short", "reasoning"])
@pytest.mark.parametrize("kind", sorted(REASONED))
def test_every_kind_renders_and_its_format_parses(prompt_set, kind):
    msgs = render(kind, prompt_set=prompt_set, **_fields(kind))
    assert msgs[0]["role"] == "system" and msgs[-1]["role"] == "user" and all(m["content"] for m in msgs)
    assert "What is (2 + 3) * 4?" in msgs[-1]["content"] and "{{" not in msgs[-1]["content"]
    if len(msgs) == 4:   # the worked example's reply: the format the prompt asks for
        example = msgs[2]["content"]
    else:                # the Critic's inline example
        example = msgs[-1]["content"].split("Example reply:\n")[-1]
    parsed = _parse(kind, example)
    assert parsed.format_reward == 1.0 and parsed.reason is None, (prompt_set, kind, example)
    if prompt_set == "reasoning":
        task = msgs[-1]["content"]
        assert "step by step" in task.lower() and "one or two short sentences" not in task
        first_tag = example.index("<")   # the example reasons before its first tag
        assert len(example[:first_tag].split()) >= 8, example
        parsed = _parse(kind, REASONED[kind])    # and a reasoned reply of the model's own parses in full
        assert parsed.format_reward == 1.0 and parsed.reason is None, (kind, parsed)
        assert parsed.fields.get("answer") or parsed.fields.get("plan") or parsed.fields.get("question") \
            or parsed.fields.get("score")


def test_the_solver_keeps_the_fields_the_verifier_reads():
    math = _parse("solver_math", REASONED["solver_math"])
    code = _parse("solver_code", REASONED["solver_code"])
    assert "20" in math.fields["answer"] and "def total" in code.fields["answer"]


def test_field_limit_counts_the_set_in_use(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    short, reasoning = (field_limit("solver_code", tok, 1024, 256, s) for s in ("short", "reasoning"))
    assert short is not None and reasoning is not None and reasoning.tokens < short.tokens   # a longer template


def _ctx(cfg):
    from sage.stages.context import Engines, StageContext
    from tests.scripted import ScriptedLLM

    return StageContext(cfg, None, run_id="r", iteration=1, engines=Engines(cfg, llm=ScriptedLLM(lambda req: "")))


def test_the_stages_render_the_configured_set():
    from sage.stages.rollouts import Unit, prompt

    short = _ctx(load_config("cpu"))
    reasoning = _ctx(load_config("paper-7b", ["seeds.sets=[]"]))
    for prompt_set, ctx in (("short", short), ("reasoning", reasoning)):
        assert prompt(ctx, "solver_math", 64, question="Q") == render("solver_math", prompt_set=prompt_set,
                                                                       question="Q")
    unit = Unit("solver_math", "q1", "math", {"question": "Q"})
    same = _ctx(load_config("cpu", ["roles.prompts=reasoning", "roles.challenger.constrain=false",
                                    "roles.planner.constrain=false"]))
    assert unit.unit_id(short, "solve") != unit.unit_id(same, "solve")   # other prompts, other rows
    assert unit.unit_id(short, "solve") == unit.unit_id(_ctx(load_config("cpu")), "solve")


def test_reasoning_prompts_with_a_grammar_that_forbids_reasoning_are_refused():
    from sage.configs import ConfigError

    with pytest.raises(ConfigError, match="roles.prompts reasoning .* challenger and planner"):
        load_config("cpu", ["roles.prompts=reasoning"])
    assert load_config("cpu", ["roles.prompts=reasoning", "roles.challenger.constrain=false",
                               "roles.planner.constrain=false"]).roles.solver.constrain   # their regexes allow it


def _replies(template) -> list[tuple[str | None, str, str]]:
    """(family, reference question, worked reply) of a template's default example and each family example."""
    return [(None, template.example["question"], template.reply)] + [
        (family, fields["question"], reply) for family, (fields, reply) in template.examples.items()]


def test_the_compose_set_asks_the_math_challenger_for_a_composite_problem_that_is_grounded():
    """`compose` is `short` but for the grounded math Challenger, whose every worked example is a problem that
    composes operations (a structure its reference lacks), states every number its program uses and names every
    operation, so it passes the challenge stage's checks and grounds its label."""
    from sage.engines.text.arithmetic import (
        arithmetic_mismatch,
        number_mismatch,
        operation_mismatch,
        program_structure,
        question_structure,
    )
    from sage.engines.text.grammar import role_regex

    short, compose = PROMPT_SETS["short"], PROMPT_SETS["compose"]
    assert [k for k in KINDS if version(k, "compose") != version(k, "short")] == ["challenger_math"]
    assert "composes two or three operations" in render("challenger_math", prompt_set="compose", question="Q")[-1][
        "content"]
    assert set(compose["challenger_math"].examples) == set(short["challenger_math"].examples)
    for family, reference, reply in _replies(compose["challenger_math"]):
        parsed = parse_challenger(reply, "math", "challenger_math")
        assert parsed.format_reward == 1.0 and re.fullmatch(role_regex("challenger_math"), reply), family
        question, program, answer = (parsed.fields[k] for k in ("question", "program", "answer"))
        assert number_mismatch(program, question) is None and operation_mismatch(program, question) is None, family
        namespace: dict = {}
        exec(program, namespace)     # the examples' own fixed text, not model output
        assert str(namespace["solve"]()) == answer and arithmetic_mismatch(question, answer) is None, family
        structure = program_structure(program)
        assert structure is not None and structure.count("(") >= 2, (family, structure)   # operations nested
        assert structure != question_structure(reference), family
    assert load_config("cpu", ["roles.prompts=compose"]).roles.prompts == "compose"
