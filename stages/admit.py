"""admit: the filter. A new question enters the pool only if its verifier is valid (a math label grounded, under
`iteration.math_labels: program`), s_q >= alpha, neither its normalised text nor, for math, what it asks
(`arithmetic.content_key`: its own arithmetic with the unknown renamed, a GCD's numbers; the same problem in other
words) is a validation or benchmark question's (`contaminated`) or already in the pool (`duplicate`), and (when
`iteration.near_duplicate_threshold` is set) it is not a near-duplicate of one, nor of any question written before
it in this iteration (so a batch of copies of one puzzle admits at most one); every rejection keeps its reason.

Reads: this iteration's generated questions not yet decided (`admitted` NULL), the pool's text and text hashes,
the validation and benchmark questions (origin `validation`, `benchmark`).
Writes: `questions.admitted`, `admitted_iteration`, `rejection_reason` (`contaminated`, `invalid_verifier`,
`low_quality`, `duplicate`, `near_duplicate`; for a math label that is not grounded, the challenge stage's reason
instead of `invalid_verifier`: `no_program`, `program_failed`, `number_mismatch`, `operation_mismatch`,
`arithmetic_mismatch`, `label_mismatch`, `no_answer`; `unparseable` was set by the challenge stage), and for
every decided question `near_dup_similarity` (the MinHash estimate of word-shingle Jaccard similarity to the
closest pool, held-out, or earlier question of this iteration) and `near_dup_of` (that question), in one
transaction.
Questions are decided in id order, so of two identical new questions the same one is admitted on every re-run.
Idempotency: only undecided questions are touched. With `iteration.challenger` false (an ablation) it decides
nothing. Fails: never on model output.
"""
# pyright: basic

from __future__ import annotations

import numpy as np

from sage.configs.names import Stage
from sage.engines.text.arithmetic import content_key
from sage.engines.text.similar import most_similar, signatures
from sage.stages.context import RunContext, StageReport, switched_off
from sage.warehouse.queries import (
    generated_questions,
    heldout_questions,
    pool_norm_hashes,
    pool_texts,
    update_rows,
)

STAGE = Stage.ADMIT
#: The challenge stage's reasons a math label is not grounded (`verifier.label`), kept as rejection reasons.
LABEL_FAILURES = frozenset({"no_program", "program_failed", "number_mismatch", "operation_mismatch",
                            "arithmetic_mismatch", "label_mismatch", "no_answer"})


def decide(q: dict, alpha: float, seen: set[str], heldout: frozenset[str] = frozenset(),
           similarity: float = 0.0, threshold: float | None = None) -> str | None:
    """The rejection reason, or None to admit. A copy of a validation or benchmark question is `contaminated`
    whatever else holds, so every copy is counted. `seen` and `heldout` hold normalised-text hashes and, for math,
    content keys (`q["content_key"]`, absent or None when the question has none)."""
    key = q.get("content_key")
    if q["norm_hash"] in heldout or (key is not None and key in heldout):
        return "contaminated"
    if not q["verifier_valid"]:
        label = (q.get("verifier") or {}).get("label") if q.get("domain") == "math" else None
        return label if label in LABEL_FAILURES else "invalid_verifier"
    if q["s_q"] is None or q["s_q"] < alpha:
        return "low_quality"
    if q["norm_hash"] in seen or (key is not None and key in seen):
        return "duplicate"
    if threshold is not None and similarity >= threshold:
        return "near_duplicate"
    return None


def _key(q: dict) -> str | None:
    """A math question's content key (`arithmetic.content_key`); None for code, whose text is a task, not a sum."""
    return content_key(q["text"] or "") if q.get("domain") == "math" else None


def run(ctx: RunContext) -> StageReport:
    it = ctx.cfg.iteration
    if not it.challenger:
        return switched_off(STAGE, "iteration.challenger")
    pending = [q for q in generated_questions(ctx.wh, ctx.run_id, ctx.iteration) if q["admitted"] is None]
    for q in pending:
        q["content_key"] = _key(q)
    pool = pool_texts(ctx.wh, ctx.run_id)
    seen = pool_norm_hashes(ctx.wh, ctx.run_id) | {k for r in pool if (k := _key(r))}
    held = heldout_questions(ctx.wh)
    heldout = frozenset(h["norm_hash"] for h in held) | {k for h in held if (k := _key(h))}
    # The texts a new question is compared with: the pool and the held-out questions, then each question of this
    # iteration before it (admitted or not: a copy of a rejected question is a copy all the same).
    refs = pool + [{"question_id": h["question_id"], "text": h["text"]} for h in held]
    ref_ids = [r["question_id"] for r in refs]
    sigs = signatures([r["text"] for r in refs] + [q["text"] or "" for q in pending], it.shingle_words,
                      it.minhash_permutations)
    ref_sigs, new_sigs = sigs[:len(refs)], sigs[len(refs):]
    updates = []
    for q, sig in zip(pending, new_sigs):
        similarity, at = most_similar(sig, ref_sigs)
        reason = decide(q, it.alpha, seen, heldout, similarity, it.near_duplicate_threshold)
        if reason is None:
            seen.update(k for k in (q["norm_hash"], q["content_key"]) if k)
        if q["text"]:
            ref_sigs = np.vstack([ref_sigs, sig[None, :]])
            ref_ids.append(q["question_id"])
        updates.append(dict(question_id=q["question_id"], admitted=reason is None,
                            admitted_iteration=ctx.iteration if reason is None else None, rejection_reason=reason,
                            near_dup_similarity=similarity, near_dup_of=None if at is None else ref_ids[at]))
    with ctx.wh.transaction():
        update_rows(ctx.wh, "questions", "question_id", updates)
    admitted = sum(u["admitted"] for u in updates)
    reasons: dict[str, int] = {}
    for u in updates:
        if u["rejection_reason"]:
            reasons[u["rejection_reason"]] = reasons.get(u["rejection_reason"], 0) + 1
    return StageReport(STAGE, rows_in=len(pending), rows_out=admitted,
                       info={"admitted": admitted, "rejected": len(updates) - admitted, **reasons})
