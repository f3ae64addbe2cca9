"""evaluate: score the base model or a checkpoint's adapter on a benchmark, pass@1 greedy and pass@k sampled.

Reads: benchmark problems from `sage.engines.data.benchmarks` (offline packages, the hub, or a local file given as
`name=path`), and the adapter of the checkpoint being evaluated (`ctx.adapter`; None for the base model).
Generates in one `llm.generate` call per (checkpoint, benchmark): a greedy answer per problem, plus, when
n > 1, n samples per problem at `roles.solver` temperature/top_p. Math answers are extracted and checked
with the math checker; code runs in the sandbox and counts as correct only when every test passes
(HumanEval: every assertion of its official check, with the assertion's own comparison; `check_set` in the
decoding settings hashes the checks and the seed of their inputs); scoring runs through `ctx.fanout` (here,
or on Ray workers). Writes: `evaluations` rows,
metric `pass@1` (greedy) and `pass@k` for each k (unbiased estimator over the n samples), `n` = problems
scored, `decoding` = the settings that determine the number plus `correct`, the per-problem count of
correct samples it was computed from (not part of the id).
Idempotency key: eval_id = content hash of (run, checkpoint, benchmark, metric, n, decoding settings); a
(checkpoint, benchmark) whose rows are all stored generates nothing. Fails: BenchmarkUnavailable when the
data cannot be read; engine errors propagate; model output never fails.
"""
# pyright: basic

from __future__ import annotations

import re

from sage.configs.names import Role
from sage.engines.data.benchmarks import BENCHMARKS, Problem, load_benchmark, pass_at_k
from sage.engines.data.code_jobs import code_job, code_passes, complete_code_verifiers
from sage.engines.llm.base import GenRequest
from sage.engines.text import tags
from sage.stages.context import StageContext, StageReport
from sage.stages.prompts import PromptKind, version
from sage.stages.rollouts import prompt
from sage.warehouse import content_id, seed_from_id
from sage.warehouse.checkpoints import Checkpoint
from sage.warehouse.eval_queries import insert_evaluations, stored_evaluations

_IMPORT_LINE = re.compile(r"^(?:from\s+[\w.]+\s+import\s+[^\n]+|import\s+[\w., ]+)$", re.M)


def parse_benchmark(spec: str) -> tuple[str, str | None]:
    """`name` or `name=path/to/local.jsonl` -> (name, path)."""
    name, _, path = spec.partition("=")
    name = name.strip().lower()
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)} "
                         f"(hub sets also take a local file: gsm8k=path/to/test.jsonl)")
    return name, (path.strip() or None)


def load_problems(ctx: StageContext, spec: str, limit: int | None = None) -> list[Problem]:
    """The first `limit` problems of a benchmark, code verifiers completed (references run in the sandbox,
    wherever the flow fans out; problems whose reference is nondeterministic are dropped)."""
    name, path = parse_benchmark(spec)
    problems = load_benchmark(name, limit=limit, path=path)
    if any(p.domain == "code" and "outputs" not in p.verifier and p.verifier.get("kind") != "stdin"
           for p in problems):
        problems = [p for chunk in ctx.fanout.map(completed_chunk, problems) for p in chunk]
    return problems


def completed_chunk(engines, problems: list[Problem]) -> list[Problem]:
    """`complete_code_verifiers` on a chunk of problems with the worker's sandbox; a chunk for `ctx.fanout`."""
    return complete_code_verifiers(problems, engines.sandbox)


# ------------------------------------------------------------------------------------------ decoding

def decoding_settings(ctx: StageContext, spec: str, problems: list[Problem], samples: int) -> dict:
    """What determines a number besides the checkpoint: model, prompts, sampling, answer length, data."""
    solver = ctx.cfg.roles.solver
    greedy = samples == 1
    name, path = parse_benchmark(spec)
    templates = sorted({version(PromptKind.solver(p.domain), ctx.cfg.roles.prompts) for p in problems})
    return {"model": ctx.cfg.model.name, "templates": templates,
            "temperature": 0.0 if greedy else solver.temperature, "top_p": 1.0 if greedy else solver.top_p,
            "samples": samples, "max_new_tokens": solver.max_new_tokens, "constrain": solver.constrain,
            "seed": ctx.cfg.run.seed, "data": path or name,
            "problem_set": content_id([(p.problem_id, p.question) for p in problems]),
            **check_set(problems)}


def check_set(problems: list[Problem]) -> dict:
    """For assertion-check benchmarks, the hash of what fixes their test inputs: each official check and the
    seed its loop-built inputs (HumanEval/38, /50) are drawn with."""
    checks = [(p.problem_id, p.verifier["seed"], p.verifier["check"]) for p in problems
              if p.verifier.get("kind") == "check"]
    return {"check_set": content_id(checks)} if checks else {}


def eval_id(run_id: str | None, checkpoint: str, benchmark: str, metric: str, n: int, settings: dict) -> str:
    return content_id("evaluation", run_id, checkpoint, benchmark, metric, n, settings)


def _metrics(settings_greedy: dict, settings_sampled: dict | None, ks: list[int]) -> list[tuple[str, int, dict]]:
    """(metric, k, settings) of every row one (checkpoint, benchmark) produces."""
    out = [("pass@1", 1, settings_greedy)]
    if settings_sampled is not None:
        out += [(f"pass@{k}", k, {**settings_sampled, "k": k}) for k in ks]
    return out


def _request(ctx: StageContext, p: Problem, samples: int) -> GenRequest:
    solver = ctx.cfg.roles.solver
    regex = tags.role_regex(tags.role_key(Role.SOLVER, p.domain), solver.max_new_tokens) if solver.constrain else None
    seed = seed_from_id(content_id(ctx.cfg.run.seed, "evaluate", p.benchmark, p.problem_id, samples))
    greedy = samples == 1
    messages = prompt(ctx, PromptKind.solver(p.domain), solver.max_new_tokens, question=p.question)
    return GenRequest(messages=messages, n=samples,
                      max_new_tokens=solver.max_new_tokens, temperature=0.0 if greedy else solver.temperature,
                      top_p=1.0 if greedy else solver.top_p, seed=seed, regex=regex)


# ------------------------------------------------------------------------------------------ scoring

def program(p: Problem, code: str) -> str:
    """The code to run for a code answer: the question's imports first (HumanEval's `from typing import List`),
    and the question itself in front of a body-only completion when the question defines the function."""
    entry = p.verifier.get("entry_point")
    if entry and not re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry)}\s*\(", code, re.M) \
            and re.search(rf"^def\s+{re.escape(entry)}\s*\(", p.question, re.M):
        code = p.question.rstrip("\n") + "\n" + code
    header = "\n".join(_IMPORT_LINE.findall(p.question)) if p.verifier.get("kind") != "stdin" else ""
    return f"{header}\n{code}" if header else code


def score(ctx: StageContext, items: list[tuple[Problem, str]]) -> list[bool]:
    """Whether each (problem, completion text) is correct: math by the checker, code by every test passing.
    Runs through `ctx.fanout`: in this process, or in chunks on Ray workers."""
    return [flag for chunk in ctx.fanout.map(score_chunk, items) for flag in chunk]


def score_chunk(engines, items: list[tuple[Problem, str]]) -> list[bool]:
    """`score` of one chunk; `engines` offers `.mathcheck` and `.sandbox` (see stages/fanout.py)."""
    from sage.engines.text.answers import extract_answer

    correct = [False] * len(items)
    math_idx, pairs, code_idx, jobs = [], [], [], []
    for i, (p, text) in enumerate(items):
        answer = tags.parse_solver(text, p.domain).fields.get("answer")
        if p.domain == "math":
            pred = extract_answer(answer) or (answer or "").strip() or extract_answer(text)
            if pred:
                math_idx.append(i)
                pairs.append((str(p.verifier["answer"]), pred))
        elif answer:
            code_idx.append(i)
            jobs.append(code_job(p.verifier, program(p, answer)))
    for i, s in zip(math_idx, engines.mathcheck.check_many(pairs) if pairs else []):
        correct[i] = s == 1.0
    for i, res in zip(code_idx, engines.sandbox.execute(jobs)):
        correct[i] = code_passes(items[i][0].verifier, res)
    return correct


# ------------------------------------------------------------------------------------------ the stage

def run(ctx: StageContext, target: Checkpoint, spec: str, problems: list[Problem], n: int = 1,
        ks: list[int] | tuple[int, ...] = ()) -> StageReport:
    """Evaluate `target` (its adapter must be `ctx.adapter`) on `problems` of benchmark `spec`; write the
    missing `evaluations` rows. `info["eval_ids"]` names every row this evaluation stands for."""
    if n < 1 or any(not 1 <= k <= n for k in ks):
        raise ValueError(f"pass@k needs 1 <= k <= n samples; got n={n}, k={list(ks)} (raise --n or lower --k)")
    name, _ = parse_benchmark(spec)
    greedy_set = decoding_settings(ctx, spec, problems, 1)
    sampled_set = decoding_settings(ctx, spec, problems, n) if n > 1 and ks else None
    metrics = _metrics(greedy_set, sampled_set, list(ks))
    ids = [eval_id(ctx.run_id, target.stored, name, m, len(problems), s) for m, _, s in metrics]
    have = stored_evaluations(ctx.wh, ids)
    info = {"eval_ids": ids, "benchmark": name, "checkpoint": target.label}
    if not problems or len(have) == len(ids):
        return StageReport("evaluate", rows_in=len(problems), rows_out=0, info=info)

    want_greedy = ids[0] not in have
    want_sampled = sampled_set is not None and any(i not in have for i in ids[1:])
    requests = ([_request(ctx, p, 1) for p in problems] if want_greedy else []) + \
               ([_request(ctx, p, n) for p in problems] if want_sampled else [])
    stage = f"evaluate {name} {target.label}"
    ctx.report(stage, 0, len(requests))
    results = ctx.llm.generate(requests, progress=lambda done, total, tok: ctx.report(stage, done, total, tok))
    items = [(problems[i % len(problems)], c.text) for i, r in enumerate(results) for c in r.completions]
    flags = iter(score(ctx, items))
    greedy_c = [int(next(flags)) for _ in problems] if want_greedy else None
    sampled_c = [sum(next(flags) for _ in range(n)) for _ in problems] if want_sampled else None

    rows = []
    for (metric, k, settings), row_id in zip(metrics, ids):
        counts = greedy_c if settings is greedy_set else sampled_c
        if row_id in have or counts is None:
            continue
        samples = settings["samples"]
        value = sum(pass_at_k(samples, c, k) for c in counts) / len(counts)
        rows.append(dict(eval_id=row_id, run_id=ctx.run_id, checkpoint=target.stored, benchmark=name,
                         metric=metric, value=value, n=len(problems),
                         decoding={**settings, "correct": {p.problem_id: c for p, c in zip(problems, counts)}}))
    written = insert_evaluations(ctx.wh, rows)
    return StageReport("evaluate", rows_in=len(problems), rows_out=written, info=info)
