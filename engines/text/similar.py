"""Near-duplicate text: MinHash signatures over word shingles (`datasketch`) and the highest estimated
Jaccard similarity of a text to a set of others. Used by admission to measure, and optionally reject,
generated questions that reword a pool, validation or benchmark question."""

from __future__ import annotations

import re

import numpy as np

_WORD = re.compile(r"\w+")


def shingles(text: str, k: int) -> set[str]:
    """Word k-shingles of the lower-cased text (the whole text as one shingle when it has fewer than k words)."""
    words = _WORD.findall(text.casefold())
    if len(words) < k:
        return {" ".join(words)}
    return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}


def signatures(texts: list[str], k: int, num_perm: int, seed: int = 1) -> np.ndarray:
    """One MinHash signature per text, as rows of a (len(texts), num_perm) array."""
    from datasketch import MinHash

    if not texts:
        return np.zeros((0, num_perm), dtype=np.uint64)
    hashes = MinHash.bulk([[s.encode("utf-8") for s in shingles(t, k)] for t in texts], num_perm=num_perm, seed=seed)
    return np.stack([h.hashvalues for h in hashes])


def most_similar(signature: np.ndarray, others: np.ndarray) -> tuple[float, int | None]:
    """(estimated Jaccard similarity, row index) of the row of `others` closest to `signature`; (0.0, None)
    when `others` is empty. The estimate is the share of equal MinHash values."""
    if len(others) == 0:
        return 0.0, None
    sims = (others == signature).mean(axis=1)
    best = int(sims.argmax())
    return float(sims[best]), best


def repetition(sigs: np.ndarray, threshold: float) -> list[float]:
    """For each row of `sigs`, the share of all rows (itself included) whose estimated Jaccard similarity to it is at
    least `threshold`: how much of a batch a text repeats (R-Zero's repetition penalty, |cluster| / batch, with a
    text's cluster its neighbours at `threshold`). [] for no rows."""
    if len(sigs) == 0:
        return []
    close = (sigs[:, None, :] == sigs[None, :, :]).mean(axis=2) >= threshold
    return [float(v) for v in close.sum(axis=1) / len(sigs)]
