"""Which model a checkpoint name means, for every command that takes one (`sage eval`, `sage export`, the
eval deployment of `sage serve`): `base`, `best`, `latest` or an iteration number.

The base model is a checkpoint like any other: iteration 0, no adapter. `best` is the checkpoint validation
marked (iteration 0 when nothing beat the base model); `latest` is the highest iteration with a checkpoint
(the last trained adapter, or the base model before any); `N` is iteration N, and `0` is the base model even
in a run that never validated it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sage.warehouse.db import Warehouse
from sage.warehouse.queries import located_path
from sage.warehouse.validate_queries import BASE

NAMES = ("base", "best", "latest")


class CheckpointNotFound(ValueError):
    """The name is not a checkpoint, or the run has no such checkpoint; the message says what exists."""


@dataclass(frozen=True)
class Checkpoint:
    label: str                   # as the user named it: 'base', 'best (iteration 3)', 'iteration 2'
    iteration: int               # 0 = the base model
    adapter: str | None          # the LoRA adapter directory, where it is now; None for the base model
    val_accuracy: float | None = None
    path: str | None = None      # the adapter as `checkpoints.adapter_path` stores it (relative to the project)

    @property
    def stored(self) -> str:
        """How `checkpoints.adapter_path` and `evaluations.checkpoint` name it: 'base' or the stored adapter path
        (the same wherever the project directory moves)."""
        return self.path or self.adapter or BASE


def _rows(wh: Warehouse, run_id: str) -> list[dict]:
    return wh.rows("SELECT iteration, adapter_path, val_accuracy, is_best FROM checkpoints WHERE run_id = ? "
                   "ORDER BY iteration", [run_id])


def resolve_checkpoint(wh: Warehouse, run_id: str | None, which: str | int) -> Checkpoint:
    """The checkpoint `which` names in `run_id` (only 'base' works without a run)."""
    key = str(which).strip().lower()
    if key not in NAMES and not key.isdigit():
        raise CheckpointNotFound(f"checkpoint {which!r}: use 'best', 'latest' or an iteration number, or 'base' "
                                 f"for the base model")
    if key in ("base", "0"):
        return Checkpoint("base" if key == "base" else "iteration 0", 0, None, _base_accuracy(wh, run_id))
    if run_id is None:
        raise CheckpointNotFound(f"checkpoint {which!r} belongs to a run: pass --run (only 'base' works without one)")
    rows = _rows(wh, run_id)
    if key == "best":
        found = [r for r in rows if r["is_best"]][-1:]
    elif key == "latest":
        found = rows[-1:]
    else:
        found = [r for r in rows if r["iteration"] == int(key)]
    if not found:
        have = [r["iteration"] for r in rows]
        have = (f"it has checkpoints at iterations {have}" if have
                else "it has no checkpoints yet (validation and the train stage write them)")
        what = {"best": "no best checkpoint yet (validation marks it)", "latest": "no checkpoint"}.get(
            key, f"no checkpoint for iteration {key}")
        raise CheckpointNotFound(f"run {run_id!r} has {what}: {have}")
    row = found[0]
    label = f"iteration {row['iteration']}" if key.isdigit() else f"{key} (iteration {row['iteration']})"
    path = None if row["adapter_path"] == BASE else row["adapter_path"]
    return Checkpoint(label, row["iteration"], located_path(wh, path), row["val_accuracy"], path)


def _base_accuracy(wh: Warehouse, run_id: str | None) -> float | None:
    if run_id is None or wh is None:
        return None
    return wh.scalar("SELECT val_accuracy FROM checkpoints WHERE run_id = ? AND iteration = 0", [run_id])
