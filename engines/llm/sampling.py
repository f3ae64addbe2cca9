"""Token choice over a batch of logits for the `hf` backend: argmax, seeded inverse-CDF draws, log-probs.

Every result depends only on its own row (and, for a draw, on one uniform), never on the other rows, so a
request samples the same tokens whatever it is batched with.

Why not `torch.argmax` / `softmax` + `cumsum` over the vocabulary: on a CPU, `argmax` along a vocabulary-sized
row is much slower than `amax`, and a float64 cumulative sum of the whole distribution costs more than the
rest of the draw. Both work here on blocks of about 1024
entries: the block maxima (or block sums) pick a block, then only that block is searched.
"""

from __future__ import annotations

import functools

import torch

_MASK64 = 2**64 - 1


def uniform(seed: int, step: int) -> float:
    """A uniform in [0, 1) from (seed, step): splitmix64, so no generator state depends on the batch."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


@functools.cache
def _block(vocab: int) -> int | None:
    """The divisor of `vocab` in [256, 4096] closest to 1024, or None (then rows are searched whole)."""
    fits = [c for c in range(256, 4097) if vocab % c == 0]
    return min(fits, key=lambda c: abs(c - 1024)) if fits else None


def argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)` of a (rows, vocab) tensor, first index on ties: the first block holding the row's maximum
    holds its first occurrence."""
    rows, vocab = x.shape
    size = _block(vocab)
    if size is None or x.device.type != "cpu":
        return x.argmax(-1)
    blocks = x.view(rows, vocab // size, size)
    best = blocks.amax(-1).argmax(-1)
    return best * size + blocks[torch.arange(rows, device=x.device), best].argmax(-1)


def log_normalizer(x: torch.Tensor) -> torch.Tensor:
    """`torch.logsumexp(x, -1)` of a float32 (rows, vocab) tensor, in fewer passes over memory."""
    top = x.amax(-1, keepdim=True)
    return (x - top).exp_().sum(-1).log_() + top.view(-1)


def draw(scores: torch.Tensor, temperature: list[float], top_p: list[float], u: list[float]) -> torch.Tensor:
    """One sample per row of softmax(scores / temperature), top-p truncated, by inverse CDF at uniform u.
    Masked entries (-inf) have probability 0 and are never drawn."""
    dev = scores.device
    temps = torch.tensor(temperature, device=dev, dtype=scores.dtype).view(-1, 1)
    s = scores if all(t == 1.0 for t in temperature) else scores / temps
    weights = (s - s.amax(-1, keepdim=True)).exp_()  # unnormalised probabilities
    if any(p < 1 for p in top_p):
        probs = weights / weights.sum(-1, keepdim=True)
        sorted_p, order = probs.sort(-1, descending=True)
        before = sorted_p.double().cumsum(-1) - sorted_p  # mass ahead of each entry, most likely first
        keep = before < torch.tensor(top_p, device=dev, dtype=torch.float64).view(-1, 1)
        weights = weights.scatter(-1, order, sorted_p.masked_fill(~keep, 0.0))
    return inverse_cdf(weights, torch.tensor(u, device=dev, dtype=torch.float64))


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first index i with cumsum(weights)[i] > u * sum(weights), i.e. a draw proportional to the
    non-negative `weights`; an entry of weight 0 is never returned."""
    rows, vocab = weights.shape
    size = _block(vocab) or vocab
    n = vocab // size
    idx = torch.arange(rows, device=weights.device)
    blocks = weights.view(rows, n, size).sum(-1).double()
    cum = blocks.cumsum(-1)
    target = u * cum[:, -1]
    last = torch.where(blocks > 0, torch.arange(n, device=weights.device), 0).amax(-1)  # last block with mass
    best = torch.minimum(torch.searchsorted(cum, target.view(-1, 1), right=True).view(-1), last)
    ahead = torch.where(best > 0, cum[idx, (best - 1).clamp(min=0)], 0.0)
    inner = weights.view(rows, n, size)[idx, best].double().cumsum(-1)
    pick = torch.searchsorted(inner, (target - ahead).view(-1, 1), right=True).view(-1)
    # rounding can push the target past the block's total: take the block's last entry with mass instead
    last_in_block = torch.searchsorted(inner, inner[:, -1:].contiguous(), right=False).view(-1)
    return best * size + torch.minimum(pick, last_in_block)
