"""Generation shared by the role stages: build requests, skip what exists, generate in committed batches.

A *unit* is one prompt for one role about one question (and plan); it yields `n` rollouts. Rollout ids hash
(run, iteration, purpose, question, plan, template version, sample index), and the request seed derives from
the unit's id, so a re-run regenerates exactly the missing rollouts with the samples they would have had.
Rollouts are committed `run.batch_rows` units per transaction. On vllm a stage's pending units go to the engine in
one call and are committed after it returns: an interrupted stage loses all of its generation that was not
committed yet (a re-run redoes exactly that), in exchange for vLLM batching the whole stage by token budget. On hf
each commit's units are one engine call, so an interruption loses at most one commit's work.
Grammar annealing (`roles.<role>.unconstrained`): in a training purpose, each sample of a constrained role is
drawn without the grammar with the iteration's share, picked by a hash of its rollout id; `rollouts.constrained`
records which were.
"""
# pyright: basic

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sage.configs.names import TRAINED_PURPOSES, Purpose, Role, Stage
from sage.engines.llm.base import GenRequest, GenResult
from sage.engines.text import tags
from sage.stages.context import RunContext, StageContext
from sage.stages.prompts import PromptKind, field_limit, render, version
from sage.warehouse import content_id, seed_from_id
from sage.warehouse.queries import existing_ids, stored_path


@dataclass
class Unit:
    kind: PromptKind               # which template (stages/prompts)
    question_id: str
    domain: str
    fields: dict[str, Any]         # template fields
    n: int = 1
    plan_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # kept for the caller, not stored

    def __post_init__(self) -> None:
        self.kind = PromptKind(self.kind)   # a kind's name given as text is checked here, not at render

    @property
    def role(self) -> Role:
        return self.kind.role

    def unit_id(self, ctx: RunContext, purpose: Purpose) -> str:
        return content_id("unit", ctx.run_id, ctx.iteration, purpose, self.question_id, self.plan_id,
                          version(self.kind, ctx.cfg.roles.prompts))

    def rollout_id(self, ctx: RunContext, purpose: Purpose, sample: int) -> str:
        return content_id("rollout", self.unit_id(ctx, purpose), sample)


def question_fields(question: dict, plan: str | None = None) -> dict[str, Any]:
    """Template fields for a stored question (a `questions` row): its text, a code question's function
    (its signature, else its entry point's name) and, when given, the plan. Planner, Critic and Solver all
    see the function a code answer must define."""
    fields: dict[str, Any] = {"question": question["text"]}
    if question["domain"] == "code":
        verifier = question.get("verifier") or {}
        function = verifier.get("signature") or verifier.get("entry_point")
        if function:
            fields["signature"] = function
    if plan is not None:
        fields["plan"] = plan
    return fields


def prompt(ctx: StageContext, kind: PromptKind, max_new_tokens: int, **fields: Any) -> list[dict]:
    """The chat messages of one prompt, its fields cut to the tokens the context leaves (`field_limit`)."""
    limit = field_limit(kind, getattr(ctx.engines.llm, "tokenizer", None), ctx.cfg.model.max_model_len, max_new_tokens,
                        ctx.cfg.roles.prompts)
    return render(kind, limit, prompt_set=ctx.cfg.roles.prompts, **fields)


def format_key(unit: Unit) -> str:
    """The output format (`tags.REQUIRED_TAGS` / `ROLE_REGEX` key) a unit's replies are held to: a Challenger's
    is its prompt kind (the math kinds differ in format), the others' their role's."""
    if unit.role == Role.CHALLENGER:
        return unit.kind
    return tags.role_key(unit.role, unit.domain if unit.role == Role.SOLVER else None)


def parse(role: Role, domain: str, text: str, key: str | None = None) -> tags.Parsed:
    """A completion's fields and format reward, by its role's output format. Raises ValueError for a role with no
    parser: a role added to `Role` needs one here (and its tags in engines/text/tags.py)."""
    if role == Role.CHALLENGER:
        return tags.parse_challenger(text, domain, key)
    if role == Role.PLANNER:
        return tags.parse_planner(text)
    if role == Role.CRITIC:
        return tags.parse_critic(text)
    if role == Role.SOLVER:
        return tags.parse_solver(text, domain)
    raise ValueError(f"no parser for role {role!r}; give it one in stages/rollouts.py `parse`")


def _free(ctx: RunContext, role: Role, purpose: Purpose, greedy: bool, rollout_ids: list[str]) -> frozenset[int]:
    """The samples drawn without the grammar (grammar annealing, training purposes only): sample j when a
    uniform from a hash of its rollout id (and the run seed) falls below the role's share for this iteration,
    so a re-run picks the same ones."""
    share = getattr(ctx.cfg.roles, role).unconstrained_share(ctx.iteration)
    if greedy or purpose not in TRAINED_PURPOSES or share == 0:
        return frozenset()
    return frozenset(j for j, rid in enumerate(rollout_ids)
                     if seed_from_id(content_id("unconstrained", ctx.cfg.run.seed, rid)) < share * 2**31)


def _request(ctx: RunContext, unit: Unit, purpose: Purpose, greedy: bool, rollout_ids: list[str]) -> GenRequest:
    role_cfg = getattr(ctx.cfg.roles, unit.role)
    regex = None
    if role_cfg.constrain:
        regex = tags.role_regex(format_key(unit), role_cfg.max_new_tokens)
    seed = seed_from_id(content_id(ctx.cfg.run.seed, unit.unit_id(ctx, purpose)))
    return GenRequest(messages=prompt(ctx, unit.kind, role_cfg.max_new_tokens, **unit.fields), n=unit.n,
                      max_new_tokens=role_cfg.max_new_tokens, temperature=0.0 if greedy else role_cfg.temperature,
                      top_p=role_cfg.top_p, seed=seed, regex=regex,
                      free=_free(ctx, unit.role, purpose, greedy, rollout_ids))


def _generated(ctx: RunContext, pending: list[Unit], purpose: Purpose, greedy: bool,
               ids: dict[int, list[str]], shown: Callable[[int, int], None] = lambda done, tokens: None,
               ) -> Iterator[tuple[int, list[Unit], list[GenRequest], list[GenResult]]]:
    """`pending` generated, in commits of `run.batch_rows` units: (offset, units, requests, results). Backend vllm
    generates the whole stage in one engine call, whose scheduler batches by token budget (no call waits for its
    longest completion before the next starts); hf makes one call per commit, each split further by
    `model.token_budget`. The next commit is generated (hf) or cut (vllm) only once the caller has stored this one.
    `shown(units done, new tokens)` hears of each batch the engine finishes inside a call (progress only: what is
    committed, and when, stays the same)."""
    step = ctx.cfg.run.batch_rows
    for start, role_units in _role_runs(pending):  # each role generates with its own adapter (`adapter_for`)
        per_call = max(len(role_units), 1) if ctx.cfg.model.backend == "vllm" else step
        for call in range(0, len(role_units), per_call):
            units, at_call = role_units[call:call + per_call], start + call
            requests = [_request(ctx, u, purpose, greedy, ids[id(u)]) for u in units]
            results = ctx.llm_for(units[0].role).generate(
                requests, progress=lambda done, _, tokens, at=at_call: shown(at + done, tokens))
            for at in range(0, len(units), step):
                yield at_call + at, units[at:at + step], requests[at:at + step], results[at:at + step]


def _role_runs(units: list[Unit]) -> Iterator[tuple[int, list[Unit]]]:
    """`units` cut into runs of one role, in order: (offset of the run, its units)."""
    start = 0
    for end in range(1, len(units) + 1):
        if end == len(units) or units[end].role != units[start].role:
            yield start, units[start:end]
            start = end


def generate(ctx: RunContext, stage: Stage, purpose: Purpose, units: list[Unit],
             greedy: bool = False) -> tuple[int, int]:
    """Generate every missing rollout of `units`; returns (units processed, rollouts written)."""
    ids = {id(u): [u.rollout_id(ctx, purpose, j) for j in range(u.n)] for u in units}
    have = existing_ids(ctx.wh, "rollouts", "rollout_id", [r for rs in ids.values() for r in rs])
    pending = [u for u in units if not all(r in have for r in ids[id(u)])]
    written, tokens = 0, 0
    ctx.report(stage, 0, len(pending), 0)

    def shown(done: int, call_tokens: int) -> None:  # inside an engine call: its tokens on top of those stored
        ctx.report(stage, done, len(pending), tokens + call_tokens)

    for start, batch, requests, results in _generated(ctx, pending, purpose, greedy, ids, shown):
        rows = []
        adapters = {role: None if path is None else stored_path(ctx.wh, path)  # project-relative
                    for role in {u.role for u in batch} for path in [ctx.adapter_for(role)]}
        for unit, req, res in zip(batch, requests, results):
            adapter = adapters[unit.role]
            for j, comp in enumerate(res.completions):
                rid = ids[id(unit)][j]
                if rid in have:
                    continue
                text = comp.text.encode("utf-8", "replace").decode("utf-8")  # storable whatever came back
                p = parse(unit.role, unit.domain, text, format_key(unit))
                rows.append(dict(
                    rollout_id=rid, run_id=ctx.run_id, iteration=ctx.iteration, stage=stage, role=unit.role,
                    purpose=purpose, question_id=unit.question_id, plan_id=unit.plan_id,
                    template=version(unit.kind, ctx.cfg.roles.prompts), prompt_text=res.prompt_text,
                    completion_text=text,
                    prompt_ids=res.prompt_ids, completion_ids=comp.token_ids, logprobs=comp.logprobs,
                    adapter=adapter, sample_index=j, seed=req.seed, finish_reason=comp.finish_reason,
                    prompt_tokens=len(res.prompt_ids), completion_tokens=len(comp.token_ids),
                    parsed=p.fields, format_reward=p.format_reward, format_reason=p.reason,
                    constrained=req.regex_for(j) is not None,
                    plan_shown=unit.kind.shows_plan if unit.role == Role.SOLVER else None))
                tokens += len(comp.token_ids)
        written += ctx.wh.insert_batch("rollouts", rows)
        ctx.report(stage, start + len(batch), len(pending), tokens)
    return len(pending), written
