"""admit: the filter. A new question enters the pool only if its verifier is valid, s_q >= alpha and its
normalised text is not already in the pool; every rejection keeps its reason.

Reads: this iteration's generated questions not yet decided (`admitted` NULL), the pool's text hashes.
Writes: `questions.admitted`, `admitted_iteration`, `rejection_reason` (`invalid_verifier`, `low_quality`,
`duplicate`; `unparseable` was set by the challenge stage), in one transaction. Questions are decided in id
order, so of two identical new questions the same one is admitted on every re-run.
Idempotency: only undecided questions are touched. Fails: never on model output.
"""

from __future__ import annotations

from sage.configs.names import Stage
from sage.stages.context import StageContext, StageReport
from sage.warehouse.queries import generated_questions, pool_norm_hashes, update_rows

STAGE = Stage.ADMIT


def decide(q: dict, alpha: float, seen: set[str]) -> str | None:
    """The rejection reason, or None to admit."""
    if not q["verifier_valid"]:
        return "invalid_verifier"
    if q["s_q"] is None or q["s_q"] < alpha:
        return "low_quality"
    if q["norm_hash"] in seen:
        return "duplicate"
    return None


def run(ctx: StageContext) -> StageReport:
    pending = [q for q in generated_questions(ctx.wh, ctx.run_id, ctx.iteration) if q["admitted"] is None]
    seen = pool_norm_hashes(ctx.wh, ctx.run_id)
    updates = []
    for q in pending:
        reason = decide(q, ctx.cfg.iteration.alpha, seen)
        if reason is None:
            seen.add(q["norm_hash"])
        updates.append(dict(question_id=q["question_id"], admitted=reason is None,
                            admitted_iteration=ctx.iteration if reason is None else None, rejection_reason=reason))
    with ctx.wh.transaction():
        update_rows(ctx.wh, "questions", "question_id", updates)
    admitted = sum(u["admitted"] for u in updates)
    return StageReport(STAGE, rows_in=len(pending), rows_out=admitted,
                       info={"admitted": admitted, "rejected": len(updates) - admitted})
