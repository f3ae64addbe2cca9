"""Math seed questions as `questions` rows, for the stage unit tests that sample the pool (challenge, plan)."""

from __future__ import annotations

from sage.warehouse import norm_hash

SEEDS = ["What is 2+2?", "What is 10-3?", "Compute 6*7.", "What is 9+1?", "What is 8-5?", "Compute 3*3.",
         "What is 7+7?", "What is 1+1?"]


def question(qid: str, text: str, origin: str = "seed", domain: str = "math", **extra) -> dict:
    return dict(question_id=qid, origin=origin, domain=domain, text=text, verifier={"answer": "1"},
                norm_hash=norm_hash(text), **extra)


def seeds(n: int = 4) -> list[dict]:
    """The first `n` of `SEEDS`, ids s0, s1, ..."""
    return [question(f"s{k}", text) for k, text in enumerate(SEEDS[:n])]
