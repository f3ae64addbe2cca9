"""verify: the external verifier scores Solver answers; nothing here trusts the model.

Reads: Solver rollouts of one purpose (`probe` or `solve`) of this iteration without a verdict, with their
question's verifier. Math: the final answer (last \\boxed{}, the <answer> tag, "the answer is ...") is
checked against the reference with math-verify in killable worker processes (s_gt 0 or 1). Code: the
answer's code runs in the sandbox on the question's test inputs; the parent compares the returned values
with the expected outputs (s_gt = fraction of tests passed). The checks run through `ctx.fanout` (here, or
on Ray workers with `orchestration.runner: ray`); only this process writes. Writes: one `verdicts` row per
rollout, committed per batch; after the probe, `questions.difficulty` = 1 - mean probe s_gt. With
`iteration.challenger` false (an ablation) `verify_probe` reads and writes nothing.
Idempotency key: verdict id = rollout id. Fails: engine errors propagate; bad answers score 0; the `verify`
stage finding no Solver answers at all raises (the solve stage wrote none: never `done` on nothing).
"""
# pyright: basic

from __future__ import annotations

import time

from sage.configs.names import Purpose, Stage
from sage.stages.context import RunContext, StageReport, switched_off
from sage.warehouse.queries import rollout_count, set_difficulty_from_probes, unverified_rollouts


def _math_verdicts(engines, rows: list[dict]) -> list[dict]:
    from sage.engines.text.answers import extract_answer

    preds = []
    for r in rows:
        answer = r["parsed"].get("answer") or ""
        preds.append(extract_answer(answer) or answer.strip())
    golds = ["" if r["verifier"].get("answer") is None else str(r["verifier"]["answer"]) for r in rows]
    start = time.perf_counter()
    scores = engines.mathcheck.check_many(list(zip(golds, preds)))
    each = (time.perf_counter() - start) / max(1, len(rows))
    return [dict(rollout_id=r["rollout_id"], kind="math", s_gt=float(s), tests={"gold": g, "pred": p[:500]},
                 duration_s=each, backend="math-verify", error=None if p else "no answer")
            for r, g, p, s in zip(rows, golds, preds, scores)]


def _code_verdicts(engines, rows: list[dict]) -> list[dict]:
    from sage.engines.verify.outputs import score_outputs
    from sage.engines.verify.sandbox import Job

    jobs, verdicts = [], []
    for r in rows:
        v = r["verifier"]
        code = r["parsed"].get("answer") or ""
        jobs.append(Job(code, v.get("entry_point") or "", v.get("inputs") or []))
    for r, job, res in zip(rows, jobs, engines.sandbox.execute(jobs)):
        expected = r["verifier"].get("outputs") or []
        s_gt, passed = score_outputs(expected, res) if job.code.strip() and expected else (0.0, [])
        error = None if job.code.strip() else "no code"
        verdicts.append(dict(rollout_id=r["rollout_id"], kind="code", s_gt=float(s_gt),
                             tests={"passed": passed, "errors": [e for e in res.errors][:16], "status": res.status},
                             duration_s=res.duration_s, backend=res.backend, error=error or (
                                 None if res.status == "ok" else res.status)))
    return verdicts


def verdicts(engines, rows: list[dict]) -> list[dict]:
    """Verdicts of one chunk of rows; `engines` offers `.mathcheck` and `.sandbox` (see stages/fanout.py)."""
    return (_math_verdicts(engines, [r for r in rows if r["domain"] == "math"])
            + _code_verdicts(engines, [r for r in rows if r["domain"] == "code"]))


def verify_rollouts(ctx: RunContext, purpose: Purpose, stage: str) -> StageReport:
    """Verdicts for every unverified Solver rollout of `purpose` this iteration (validate uses it too)."""
    pending = unverified_rollouts(ctx.wh, ctx.run_id, ctx.iteration, purpose)
    written = done = passed = 0
    s_gt = 0.0
    ctx.report(stage, 0, len(pending))
    for chunk in ctx.fanout.map(verdicts, pending, ctx.cfg.run.batch_rows):
        for v in chunk:
            v.update(run_id=ctx.run_id, iteration=ctx.iteration)
            s_gt += v["s_gt"]
            passed += v["s_gt"] >= 1.0
        written += ctx.wh.insert_batch("verdicts", chunk)
        done += len(chunk)
        ctx.report(stage, done, len(pending))
    if purpose == Purpose.PROBE:
        with ctx.wh.transaction():
            set_difficulty_from_probes(ctx.wh, ctx.run_id, ctx.iteration)
    info = {"pass_rate": round(passed / done, 3), "mean_s_gt": round(s_gt / done, 3)} if done else {}
    return StageReport(stage, rows_in=len(pending), rows_out=written, info=info)


def run_probe(ctx: RunContext) -> StageReport:
    if not ctx.cfg.iteration.challenger:
        return switched_off(Stage.VERIFY_PROBE, "iteration.challenger")
    return verify_rollouts(ctx, Purpose.PROBE, Stage.VERIFY_PROBE)


def run_solve(ctx: RunContext) -> StageReport:
    # The probe may have nothing to probe (no question written), but every iteration solves pool questions.
    if not rollout_count(ctx.wh, ctx.run_id, ctx.iteration, Purpose.SOLVE):
        raise RuntimeError(f"verify: iteration {ctx.iteration} of run {ctx.run_id!r} has no Solver answers to verify; "
                           f"run the solve stage first (`sage stage solve --run {ctx.run_id} --iteration "
                           f"{ctx.iteration}`)")
    return verify_rollouts(ctx, Purpose.SOLVE, Stage.VERIFY)
