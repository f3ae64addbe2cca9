"""How the `hf` backend's rows become batches: one row per sample, packed by padded tokens, and the prompt
layout of a batch (left padding, or a prefix every prompt shares first and the padding after it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

# The fewest tokens of a batch-wide shared prompt prefix worth a prefill pass of its own: shorter ones save
# less than that pass's fixed cost (and a chat template's system header alone is ~15-20 tokens).
SHARED_PREFIX_MIN = 32


@dataclass
class Row:
    """One sample of a request: its prompt, sampling settings and what it has generated so far."""

    request: int
    index: int
    prompt_ids: list[int]
    max_new: int
    temperature: float
    top_p: float
    seed: int
    regex: str | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    matcher: object = None


def batches(rows: list[Row], token_budget: int):
    """`rows` longest first (prompt + most new tokens), in batches of at most `token_budget` padded tokens."""
    rows = sorted(rows, key=lambda r: (-(len(r.prompt_ids) + r.max_new), r.request, r.index))
    batch, width = [], 0
    for row in rows:
        w = max(width, len(row.prompt_ids) + row.max_new)
        if batch and (len(batch) + 1) * w > token_budget:
            yield batch
            batch, w = [], len(row.prompt_ids) + row.max_new
        batch.append(row)
        width = w
    if batch:
        yield batch


def layout(rows: list[Row], P: int, N: int, pad_id: int, share: bool = True) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The batch's prompt ids (B, P), its key mask (B, P + N), and the length of the prefix its prompts
    share in slots [0, shared).

    Prompts are left-padded to P. When the distinct prompts of the batch share a prefix of at least
    `SHARED_PREFIX_MIN` tokens (with `share`: the backend's fast path), it goes first in every row and the
    padding goes between it and the rest, `[prefix][padding][rest]`, so its keys and values sit in the same
    slots of every row and one pass computes them for all (`HFLLM._prefill`). Positions follow the unpadded
    tokens, so each row's tokens keep the positions they have alone; the prefix keeps at least one token of
    each prompt out of it (the pass over the rest gives each row's next-token logits)."""
    shared = 0
    if share and len({tuple(r.prompt_ids) for r in rows}) > 1:
        shared = min(len(os.path.commonprefix([r.prompt_ids for r in rows])),
                     min(len(r.prompt_ids) for r in rows) - 1)
        shared = shared if shared >= SHARED_PREFIX_MIN else 0
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    keymask = torch.zeros((len(rows), P + N), dtype=torch.bool)
    if shared:
        ids[:, :shared] = torch.tensor(rows[0].prompt_ids[:shared])
        keymask[:, :shared] = True
    for b, r in enumerate(rows):
        rest = r.prompt_ids[shared:]
        ids[b, P - len(rest):] = torch.tensor(rest)
        keymask[b, P - len(rest):] = True
    return ids, keymask, shared
