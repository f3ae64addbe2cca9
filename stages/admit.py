"""admit: the filter. A new question enters the pool only if its verifier is valid (a math label grounded, under
`iteration.math_labels: program`), s_q >= alpha, neither its normalised text nor, for math, what it asks
(`arithmetic.content_key`: its own arithmetic with the unknown renamed, a GCD's numbers; the same problem in other
words) is a validation or benchmark question's (`contaminated`) or already in the pool (`duplicate`), and (when
`iteration.near_duplicate_threshold` is set) it is not a near-duplicate of one, nor of any question written before
it in this iteration (so a batch of copies of one puzzle admits at most one), and its probe pass rate p (1 -
difficulty) suits `iteration.admission` (`quality`: any; `solvable`: 0 < p < 1, AZR; `band`: band_low <= p <=
band_high, R-Zero); every rejection keeps its reason. The report gives the admitted questions' mean p and
how many have a structure no seed has (`novel_structures`).

Reads: this iteration's generated questions not yet decided (`admitted` NULL), the pool's text and text hashes,
the validation and benchmark questions (origin `validation`, `benchmark`).
Writes: `questions.admitted`, `admitted_iteration`, `rejection_reason` (`contaminated`, `invalid_verifier`,
`low_quality`, `duplicate`, `near_duplicate`; for a math label that is not grounded, the challenge stage's reason
instead of `invalid_verifier`: `no_program`, `program_failed`, `number_mismatch`, `operation_mismatch`,
`arithmetic_mismatch`, `label_mismatch`, `no_answer`; `too_easy`, `too_hard`, `unprobed` under a frontier rule;
`unparseable` was set by the challenge stage), `content_key`, `structure` (`arithmetic.program_structure` of a
math question's program, else `question_structure` of its text; the pool's seeds get theirs too, so
`curriculum_structures` can count admitted questions of a structure no seed has), `batch_repetition` (the share
of the iteration's written questions within `rewards.repetition_similarity` of it, itself included: R-Zero's
|cluster| / batch), and for every decided question `near_dup_similarity` (the MinHash estimate of word-shingle
Jaccard similarity to the closest pool, held-out, or earlier question of this iteration) and
`near_dup_of` (that question), in one transaction.
Questions are decided in id order, so of two identical new questions the same one is admitted on every re-run.
Idempotency: only undecided questions are touched. With `iteration.challenger` false (an ablation) it decides
nothing. Fails: never on model output.
"""
# pyright: basic

from __future__ import annotations

import numpy as np

from sage.configs.names import Stage
from sage.engines.text.arithmetic import content_key, program_structure, question_structure
from sage.engines.text.similar import most_similar, repetition, signatures
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


def pass_rate(q: dict) -> float | None:
    """The question's probe pass rate p, its probes' mean s_gt (1 - difficulty); None when it was not probed."""
    return None if q.get("difficulty") is None else round(1.0 - q["difficulty"], 9)


def frontier(p: float | None, admission: str, low: float, high: float) -> str | None:
    """The rejection reason of probe pass rate `p` under `iteration.admission`, or None: `quality` takes any;
    `solvable` 0 < p < 1 (AZR); `band` low <= p <= high (R-Zero). `unprobed` when a rule needs p and there is none."""
    if admission == "quality":
        return None
    if p is None:
        return "unprobed"
    above, below = (p >= 1, p <= 0) if admission == "solvable" else (p > high, p < low)
    return "too_easy" if above else "too_hard" if below else None


def decide(q: dict, alpha: float, seen: set[str], heldout: frozenset[str] = frozenset(),
           similarity: float = 0.0, threshold: float | None = None, admission: str = "quality",
           band: tuple[float, float] = (0.3, 0.7)) -> str | None:
    """The rejection reason, or None to admit. A copy of a validation or benchmark question is `contaminated`
    whatever else holds, so every copy is counted. `seen` and `heldout` hold normalised-text hashes and, for math,
    content keys (`q["content_key"]`, absent or None when the question has none). Last, the probe pass rate must
    suit `admission` (`frontier`)."""
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
    return frontier(pass_rate(q), admission, *band)


def _key(q: dict) -> str | None:
    """A math question's content key (`arithmetic.content_key`); None for code, whose text is a task, not a sum."""
    return content_key(q["text"] or "") if q.get("domain") == "math" else None


def _structure(q: dict) -> str | None:
    """A math question's structure: its program's (`arithmetic.program_structure`) where the Challenger wrote one
    that the structure describes, else its text's (`question_structure`, all a seed has); None for code."""
    if q.get("domain") != "math":
        return None
    program = (q.get("verifier") or {}).get("program")
    return (program_structure(program) if isinstance(program, str) else None) or question_structure(q["text"] or "")


def _cache_keys(rows: list[dict]) -> list[dict]:
    """Set each row's `key` (`_key`); the {question_id, content_key} updates for rows whose stored
    `questions.content_key` is missing, so `heldout_leaks` compares content in SQL (admit stores the keys it
    computes: the analyser is Python)."""
    missing = []
    for r in rows:
        r["key"] = _key(r)
        if r["key"] is not None and r.get("content_key") is None:
            missing.append({"question_id": r["question_id"], "content_key": r["key"]})
    return missing


def _seed_structures(pool: list[dict]) -> tuple[set[str], list[dict]]:
    """The structures of the pool's seeds, and the {question_id, structure} updates for seeds whose stored
    `questions.structure` is missing (a seed has no program: its text's)."""
    found, missing = set(), []
    for r in pool:
        if r["origin"] != "seed":
            continue
        structure = r.get("structure") or _structure(r)
        if structure is not None:
            found.add(structure)
            if r.get("structure") is None:
                missing.append({"question_id": r["question_id"], "structure": structure})
    return found, missing


def run(ctx: RunContext) -> StageReport:
    it = ctx.cfg.iteration
    if not it.challenger:
        return switched_off(STAGE, "iteration.challenger")
    pending = [q for q in generated_questions(ctx.wh, ctx.run_id, ctx.iteration) if q["admitted"] is None]
    for q in pending:
        q["content_key"], q["structure"] = _key(q), _structure(q)
    pool = pool_texts(ctx.wh, ctx.run_id)
    seed_structures, seed_updates = _seed_structures(pool)
    held = heldout_questions(ctx.wh)
    keys = _cache_keys(pool + held)
    seen = pool_norm_hashes(ctx.wh, ctx.run_id) | {k for r in pool if (k := r["key"])}
    heldout = frozenset(h["norm_hash"] for h in held) | {k for h in held if (k := h["key"])}
    # The texts a new question is compared with: the pool and the held-out questions, then each question of this
    # iteration before it (admitted or not: a copy of a rejected question is a copy all the same).
    refs = pool + [{"question_id": h["question_id"], "text": h["text"]} for h in held]
    ref_ids = [r["question_id"] for r in refs]
    sigs = signatures([r["text"] for r in refs] + [q["text"] or "" for q in pending], it.shingle_words,
                      it.minhash_permutations)
    ref_sigs, new_sigs = sigs[:len(refs)], sigs[len(refs):]
    written = [i for i, q in enumerate(pending) if q["text"]]
    repeats = dict(zip(written, repetition(new_sigs[written], ctx.cfg.rewards.repetition_similarity)))
    updates = []
    for i, (q, sig) in enumerate(zip(pending, new_sigs)):
        similarity, at = most_similar(sig, ref_sigs)
        reason = decide(q, it.alpha, seen, heldout, similarity, it.near_duplicate_threshold, it.admission,
                        (it.band_low, it.band_high))
        if reason is None:
            seen.update(k for k in (q["norm_hash"], q["content_key"]) if k)
        if q["text"]:
            ref_sigs = np.vstack([ref_sigs, sig[None, :]])
            ref_ids.append(q["question_id"])
        updates.append(dict(question_id=q["question_id"], content_key=q["content_key"], structure=q["structure"],
                            admitted=reason is None,
                            admitted_iteration=ctx.iteration if reason is None else None, rejection_reason=reason,
                            near_dup_similarity=similarity, near_dup_of=None if at is None else ref_ids[at],
                            batch_repetition=repeats.get(i)))
    with ctx.wh.transaction():
        update_rows(ctx.wh, "questions", "question_id", updates)
        update_rows(ctx.wh, "questions", "question_id", keys)
        update_rows(ctx.wh, "questions", "question_id", seed_updates)
    admitted = sum(u["admitted"] for u in updates)
    reasons: dict[str, int] = {}
    for u in updates:
        if u["rejection_reason"]:
            reasons[u["rejection_reason"]] = reasons.get(u["rejection_reason"], 0) + 1
    # a test problem (seeds.heldout) the pool holds by text or content: the held-out set leaked into training
    leaked = sum(h["origin"] == "test" and bool({h["norm_hash"], h["key"]} & seen) for h in held)
    reasons.update({"test_in_pool": leaked} if leaked else {})
    rates = [p for q, u in zip(pending, updates) if u["admitted"] and (p := pass_rate(q)) is not None]
    mean_rate = {"mean_pass_rate": round(sum(rates) / len(rates), 3)} if rates else {}
    novel = sum(u["admitted"] and u["structure"] is not None and u["structure"] not in seed_structures
                for u in updates)
    return StageReport(STAGE, rows_in=len(pending), rows_out=admitted,
                       info={"admitted": admitted, "rejected": len(updates) - admitted, **reasons, **mean_rate,
                             "novel_structures": novel})
