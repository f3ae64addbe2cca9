"""challenge: the Challenger writes one new question (and its verifier) per reference question.

Reads: the pool (seeds + questions admitted before this iteration). Samples `iteration.n_challenge`
references with a seed derived from (run seed, iteration), so a re-run picks the same ones.
Writes: `rollouts` (purpose `challenge`), then one `questions` row per rollout (origin `generated`) with
its verifier checked: math, the reference answer parses; code, the reference solution runs twice on every
test input in the sandbox without error and with the same outputs, which become the expected outputs.
An output without a question is stored with s_q = 0 and rejection reason `unparseable`.
Idempotency key: rollout id (see stages/rollouts.py); question id = hash("generated", rollout id).
Fails: engine errors propagate (the flow retries); model output never fails the stage.
"""

from __future__ import annotations

from sage.configs.names import Purpose, Role, Stage
from sage.stages.context import StageContext, StageReport
from sage.stages.rollouts import Unit, generate
from sage.warehouse import content_id, norm_hash
from sage.warehouse.queries import existing_ids, questions_by_id, rollouts_for, sample_pool

STAGE = Stage.CHALLENGE


def references(ctx: StageContext) -> list[dict]:
    return sample_pool(ctx.wh, ctx.run_id, ctx.iteration - 1, ctx.cfg.iteration.domains, ctx.cfg.iteration.n_challenge,
                       content_id("challenge-sample", ctx.cfg.run.seed, ctx.run_id, ctx.iteration))


def parse_checks(engines, answers: list[str]) -> list[float]:
    """The math checker's score of each answer against itself (1.0: it parses); a chunk for `ctx.fanout`."""
    return engines.mathcheck.check_many([(a, a) for a in answers])


def reference_chunk(engines, jobs: list) -> list:
    """Each reference solution's outputs over two sandbox runs, or None (`reference_outputs`); a chunk for
    `ctx.fanout`."""
    from sage.engines.verify.outputs import reference_outputs

    return reference_outputs(engines.sandbox, jobs)


def _check_math(ctx: StageContext, items: list[dict]) -> None:
    """A reference answer is valid when the math checker finds it equivalent to itself: it parses, within
    the checker's time and memory limits (in its worker processes, never here), wherever the flow fans out."""
    answers = [(it["fields"].get("answer") or "").strip() for it in items]
    scores = [s for chunk in ctx.fanout.map(parse_checks, answers) for s in chunk]
    for it, a, s in zip(items, answers, scores):
        it["valid"] = bool(a) and s == 1.0
        it["error"] = None if it["valid"] else ("no reference answer" if not a else "reference answer does not parse")


def _check_code(ctx: StageContext, items: list[dict]) -> None:
    """Run each code question's reference solution twice in the sandbox (wherever the flow fans out); agreeing,
    error-free outputs that survive storage as JSON become the expected outputs."""
    from sage.engines.verify.outputs import storable
    from sage.engines.verify.sandbox import Job

    runnable = [it for it in items if it["fields"].get("solution") and it["fields"].get("inputs")]
    for it in items:
        if it not in runnable:
            it["valid"], it["error"] = False, "no reference solution or no test inputs"
    jobs = [Job(it["fields"]["solution"], it["fields"].get("entry_point") or "", it["fields"]["inputs"])
            for it in runnable]
    outputs_of = [outputs for chunk in ctx.fanout.map(reference_chunk, jobs) for outputs in chunk]
    for it, outputs in zip(runnable, outputs_of):
        stored = storable(outputs)
        it["valid"], it["outputs"] = stored is not None, stored
        it["error"] = None if stored is not None else (
            "reference solution failed or was nondeterministic" if outputs is None else "outputs are not JSON-storable")


def _question_rows(ctx: StageContext, rollouts: list[dict]) -> list[dict]:
    parents = {r["question_id"] for r in rollouts}
    domain_of = {qid: q["domain"] for qid, q in questions_by_id(ctx.wh, list(parents)).items()}
    missing = sorted(parents - set(domain_of))
    if missing:  # the references were sampled from the pool: a missing one means the warehouse lost rows
        raise LookupError(f"challenge rollouts of iteration {ctx.iteration} name reference question(s) the "
                          f"warehouse does not hold: {', '.join(missing[:3])}; the question a new one varies "
                          f"decides its domain and verifier, so nothing is guessed")
    items = []
    for r in rollouts:
        fields = r["parsed"]
        items.append({"rollout": r, "domain": domain_of[r["question_id"]], "fields": fields,
                      "question": (fields.get("question") or "").strip()})
    _check_math(ctx, [it for it in items if it["domain"] == "math" and it["question"]])
    _check_code(ctx, [it for it in items if it["domain"] == "code" and it["question"]])
    rows = []
    for it in items:
        f, r = it["fields"], it["rollout"]
        if it["domain"] == "math":
            verifier = {"answer": f.get("answer")}
        else:
            verifier = {"entry_point": f.get("entry_point"), "signature": f.get("signature"),
                        "inputs": f.get("inputs") or [], "outputs": it.get("outputs")}
        row = dict(question_id=content_id("question", "generated", r["rollout_id"]), origin="generated",
                   domain=it["domain"], text=it["question"], verifier=verifier, source=Role.CHALLENGER,
                   norm_hash=norm_hash(it["question"]), parent_id=r["question_id"], run_id=ctx.run_id,
                   iteration=ctx.iteration, rollout_id=r["rollout_id"], verifier_valid=it.get("valid", False),
                   verifier_error=it.get("error"))
        if not it["question"]:
            row.update(s_q=0.0, admitted=False, rejection_reason="unparseable",
                       verifier_error=r["format_reason"] or "no <question>")
        rows.append(row)
    return rows


def run(ctx: StageContext) -> StageReport:
    refs = references(ctx)
    units = [Unit(f"challenger_{q['domain']}", q["question_id"], q["domain"], {"question": q["text"]}) for q in refs]
    _, written = generate(ctx, STAGE, Purpose.CHALLENGE, units)
    rollouts = rollouts_for(ctx.wh, ctx.run_id, ctx.iteration, Purpose.CHALLENGE)
    done = existing_ids(ctx.wh, "questions", "rollout_id", [r["rollout_id"] for r in rollouts])
    todo = [r for r in rollouts if r["rollout_id"] not in done]
    step = ctx.cfg.run.batch_rows
    added = 0
    for start in range(0, len(todo), step):
        added += ctx.wh.insert_batch("questions", _question_rows(ctx, todo[start:start + step]))
    return StageReport(STAGE, rows_in=len(refs), rows_out=written + added,
                       info={"rollouts": written, "questions": added})
