"""The rows a training step learns from, as stored: `TrainRow`, their Parquet file (`read_rows` /
`write_rows`, what the train stage hands a training process), their checks, how many rows make one optimizer
update (`rows_per_update`) and the per-role weights of `train.loss_weighting` (`role_shares`,
`pass_role_weights`; `role_weights` for the per-update `role_mean`).

Nothing here imports torch or TRL, so the train stage can plan and write rows without loading either.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from sage.configs.schema import TrainConfig


@dataclass
class TrainRow:
    """One scored rollout, as stored: token ids, its TRR++ advantage, optionally its sampling log-probs, the
    temperature its completion was sampled at (the trainer takes its log-probs at that temperature), and whether
    it was sampled under its role's output grammar (`constrained`: its stored log-probs then say nothing the
    trainer uses; see `trainer.corrected`)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    logprobs: list[float] | None = None  # log_softmax(logits / temperature) of the completion tokens, when stored
    role: str = ""
    temperature: float = 1.0
    constrained: bool = False


def rows_per_update(cfg: TrainConfig, num_processes: int = 1) -> int:
    """Rows in one optimizer update (one TRL generation batch)."""
    return cfg.minibatch_size * cfg.grad_accum * num_processes


def role_weights(roles: list[str | None], tokens_by_role: dict[str, float]) -> list[float]:
    """`train.loss_weighting: role_mean` (per update): advantage multipliers that make every role weigh the same in
    one update's token-sum loss divided by all its tokens N: a row of role r gets N / (R * T_r), T_r being role r's
    completion tokens in the update and R the roles with any; the update's loss then is the mean over roles of each
    role's token mean. None (a padding row) gets 0. A role's share of the whole pass then depends on how its rows
    fall into updates (`pass_role_weights` does not)."""
    total = sum(tokens_by_role.values())
    present = sum(1 for t in tokens_by_role.values() if t > 0)
    return [0.0 if role is None else total / (present * tokens_by_role[role]) for role in roles]


def role_shares(tokens_by_role: dict[str, float], configured: dict[str, float] | None) -> dict[str, float]:
    """Each role's share of the pass's loss: the configured weights (`train.role_shares`; equal when None) of the
    roles with any completion token, normalised to sum to 1. A role without tokens gets no share."""
    present = [r for r, t in tokens_by_role.items() if t > 0]
    weight = {r: 1.0 if configured is None else float(configured[r]) for r in present}
    total = sum(weight.values())
    return {r: weight[r] / total for r in present}


def pass_role_weights(roles: list[str | None], block_tokens: float, tokens_by_role: dict[str, float],
                      shares: dict[str, float], updates: int) -> list[float]:
    """`train.loss_weighting: role_share`: advantage multipliers for the rows of one update (`roles`, None for a
    padding row) that give every role its share of the whole pass, however its rows fall into updates. An update's
    token-sum loss is divided by its own tokens N_b (`block_tokens`, the `dapo` normaliser), so a row of role r gets
    U * N_b * share_r / T_r, T_r being role r's completion tokens in the whole pass and U its updates: every token
    of role r then weighs U * share_r / T_r in the sum of the updates' losses, role r's tokens together
    U * share_r, and an update weighs 1 on average, as under the plain token mean."""
    return [0.0 if role is None else updates * block_tokens * shares[role] / tokens_by_role[role] for role in roles]


def check_rows(rows: list[TrainRow]) -> None:
    """Raise ValueError naming the first row that cannot be trained on (empty prompt, log-probs that do not
    match the completion, an advantage that is not finite, a temperature that is not positive)."""
    for i, r in enumerate(rows):
        if len(r.prompt_ids) == 0:
            raise ValueError(f"row {i}: empty prompt_ids")
        if r.logprobs is not None and len(r.logprobs) != len(r.completion_ids):
            raise ValueError(f"row {i}: {len(r.logprobs)} logprobs for {len(r.completion_ids)} completion tokens")
        if not math.isfinite(float(r.advantage)):
            raise ValueError(f"row {i}: advantage {r.advantage!r} is not finite")
        if not (math.isfinite(float(r.temperature)) and r.temperature > 0):
            raise ValueError(f"row {i}: temperature {r.temperature!r} is not a positive number")


def read_rows(path: str | os.PathLike) -> list[TrainRow]:
    """Rows from a Parquet file with columns prompt_ids, completion_ids, advantage[, logprobs, role, temperature,
    constrained] (a file without temperatures, written before rows had them, reads as temperature 1.0; one without
    `constrained` as unconstrained)."""
    import pyarrow.parquet as pq

    out = []
    for rec in pq.read_table(path).to_pylist():
        logprobs = rec.get("logprobs")
        out.append(TrainRow(prompt_ids=[int(t) for t in rec["prompt_ids"]],
                            completion_ids=[int(t) for t in (rec["completion_ids"] or [])],
                            advantage=float(rec["advantage"]),
                            logprobs=None if logprobs is None else [float(x) for x in logprobs],
                            role=rec.get("role") or "",
                            temperature=1.0 if rec.get("temperature") is None else float(rec["temperature"]),
                            constrained=bool(rec.get("constrained"))))
    return out


def write_rows(rows: list[TrainRow], path: str | os.PathLike) -> None:
    """Write rows in the format `read_rows` (and `python -m sage.engines.train --in`) reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "prompt_ids": pa.array([r.prompt_ids for r in rows], type=pa.list_(pa.int64())),
        "completion_ids": pa.array([r.completion_ids for r in rows], type=pa.list_(pa.int64())),
        "advantage": pa.array([float(r.advantage) for r in rows], type=pa.float64()),
        "logprobs": pa.array([r.logprobs for r in rows], type=pa.list_(pa.float64())),
        "role": pa.array([r.role for r in rows], type=pa.string()),
        "temperature": pa.array([float(r.temperature) for r in rows], type=pa.float64()),
        "constrained": pa.array([bool(r.constrained) for r in rows], type=pa.bool_()),
    })
    pq.write_table(table, path)
