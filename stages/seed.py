"""seed: load the seed pool and the held-out validation set into `questions`.

Reads: `seeds.source` (the default offline set from reasoning-gym, or a user's JSONL/Parquet file or
Hugging Face dataset). Writes: `questions` rows with origin `seed` or `validation` (run_id NULL: every run
of the warehouse shares them), all in one transaction, after the whole source has been checked.
Idempotency key: question id = hash(origin, domain, text, source); the stage itself is recorded in
`stage_runs` under run id `seeds:<hash of the seeds settings>`, so a second `sage seed` does nothing.
Code tasks: test inputs come from the task's input generator and expected outputs from its reference
solution, both run in the sandbox (twice for the solution: runs that error or disagree drop the task).
Fails: a bad user file raises SeedFileError naming file and line; nothing is written.
"""

from __future__ import annotations

from sage.configs.names import Stage
from sage.engines.data.seeds import (INPUTS_ENTRY, SeedItem, default_code, default_math, function_params,
                           input_generator_job_code, load_source, CODEIO_INPUTS_PER_TASK)
from sage.stages.context import StageContext, StageReport
from sage.warehouse import content_id, norm_hash
from sage.warehouse.queries import existing_ids

STAGE = Stage.SEED


def seeds_key(ctx: StageContext) -> str:
    s, v = ctx.cfg.seeds, ctx.cfg.validate
    return "seeds:" + content_id(s.source, s.n_math, s.n_code, s.seed, v.n_math, v.n_code, length=12)


def question_id(item: SeedItem) -> str:
    origin = "seed" if item.split == "seed" else "validation"
    return content_id("question", origin, item.domain, item.question, item.source)


def _gather(ctx: StageContext) -> list[SeedItem]:
    s, v = ctx.cfg.seeds, ctx.cfg.validate
    if s.source != "default":
        return load_source(s.source)
    items = default_math(s.n_math, s.seed, "seed") + default_math(v.n_math, s.seed, "validation")
    # Twice the candidates: tasks whose generator or solution fails in the sandbox are dropped.
    for n, split in ((s.n_code, "seed"), (v.n_code, "validation")):
        candidates = default_code(2 * n, s.seed, split)
        items += _complete_code(ctx, candidates)[:n]
    return items


def _complete_code(ctx: StageContext, items: list[SeedItem]) -> list[SeedItem]:
    """Fill in inputs (from generators) and outputs (from reference solutions) in the sandbox."""
    from sage.engines.verify.outputs import reference_outputs, storable
    from sage.engines.verify.sandbox import Job

    gen = [i for i in items if i.input_generator and "inputs" not in i.verifier]
    if gen:
        jobs = []
        for k, item in enumerate(gen):
            params = function_params(item.solution or "", item.verifier["entry_point"]) or []
            jobs.append(Job(input_generator_job_code(item.input_generator, params), INPUTS_ENTRY,
                            [[ctx.cfg.seeds.seed + k, CODEIO_INPUTS_PER_TASK]]))
        for item, res in zip(gen, ctx.sandbox.execute(jobs)):
            if res.errors[0] is None and isinstance(res.outputs[0], list):
                item.verifier["inputs"] = storable(res.outputs[0])
    todo = [i for i in items if "outputs" not in i.verifier and i.solution and i.verifier.get("inputs")]
    jobs = [Job(i.solution, i.verifier["entry_point"], i.verifier["inputs"]) for i in todo]
    for item, outputs in zip(todo, reference_outputs(ctx.sandbox, jobs)):
        stored = storable(outputs)
        if stored is not None:
            item.verifier["outputs"] = stored
    return [i for i in items if i.domain != "code" or "outputs" in i.verifier]


def run(ctx: StageContext) -> StageReport:
    items = _gather(ctx)
    if ctx.cfg.seeds.source != "default":
        # A user's code problems without outputs: computed from their reference solution, or dropped.
        items = _complete_code(ctx, items)
    ids = [question_id(i) for i in items]
    have = existing_ids(ctx.wh, "questions", "question_id", ids)
    rows = [dict(question_id=qid, origin="seed" if i.split == "seed" else "validation", domain=i.domain,
                 text=i.question, verifier=i.verifier, source=i.source, norm_hash=norm_hash(i.question))
            for qid, i in zip(ids, items) if qid not in have]
    added = ctx.wh.insert_batch("questions", rows)
    info = {f"{o}_{d}": sum(1 for i in items if i.split == o and i.domain == d)
          for o in ("seed", "validation") for d in ("math", "code")}
    return StageReport(STAGE, rows_in=len(items), rows_out=added, info=info)
