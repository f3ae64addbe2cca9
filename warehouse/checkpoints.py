"""Which model a checkpoint name means, for every command that takes one (`sage eval`, `sage export`, the
eval deployment of `sage serve`): `base`, `best`, `latest` or an iteration number.

The base model is a checkpoint like any other: iteration 0, no adapter. `best` is the checkpoint validation
marked (iteration 0 when nothing beat the base model); `latest` is the highest iteration with a checkpoint
(the last trained adapter, or the base model before any); `N` is iteration N, and `0` is the base model even
in a run that never validated it.

Checkpoint retention (`train.keep_last`) is decided here too: which adapters and optimizer states `sage run` deletes
after an iteration (`retention_plan`), the record of it (`record_pruned`), and the refusals of whatever would read
what was deleted: a checkpoint name (`resolve_checkpoint`) and a stage (`check_retained`), each a
`CheckpointPruned` that says what was deleted and by which setting.
"""
# pyright: basic

from __future__ import annotations

from dataclasses import dataclass

from sage.configs.names import Stage
from sage.warehouse.db import Warehouse
from sage.warehouse.queries import located_path
from sage.warehouse.redo import ORDER
from sage.warehouse.validate_queries import BASE

NAMES = ("base", "best", "latest")
#: Optimizer states retention keeps: beside the newest adapter (the next iteration's train stage starts from it)
#: and the one before (a redo of the newest iteration's train stage starts from that).
OPTIMIZERS_KEPT = 2
#: What `train.keep_last` keeps, for the sentences that say something was deleted.
RULE = (f"train.keep_last = K keeps the adapters of the best checkpoint and of the last K iterations, and the "
        f"optimizer state beside the last {OPTIMIZERS_KEPT}")


class CheckpointNotFound(ValueError):
    """The name is not a checkpoint, or the run has no such checkpoint; the message says what exists."""


class CheckpointPruned(CheckpointNotFound):
    """What was asked for (an adapter, or the optimizer state a redo starts from) was deleted by checkpoint
    retention (`train.keep_last`); the message says which, when, and what is still on disk."""


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
    return wh.rows("SELECT iteration, adapter_path, val_accuracy, is_best, adapter_pruned_at FROM checkpoints "
                   "WHERE run_id = ? ORDER BY iteration", [run_id])


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
    if row["adapter_pruned_at"] is not None:
        kept = [r["iteration"] for r in rows if r["adapter_path"] != BASE and r["adapter_pruned_at"] is None]
        raise CheckpointPruned(f"checkpoint {label} of run {run_id!r}: checkpoint retention deleted its adapter on "
                               f"{row['adapter_pruned_at']:%Y-%m-%d %H:%M} ({RULE}); adapters on disk: iterations "
                               f"{kept}, and 'base' is the base model")
    path = None if row["adapter_path"] == BASE else row["adapter_path"]
    return Checkpoint(label, row["iteration"], located_path(wh, path), row["val_accuracy"], path)


def _base_accuracy(wh: Warehouse, run_id: str | None) -> float | None:
    if run_id is None or wh is None:
        return None
    return wh.scalar("SELECT val_accuracy FROM checkpoints WHERE run_id = ? AND iteration = 0", [run_id])


# -- retention ---------------------------------------------------------------------------------------------------

def retention_plan(wh: Warehouse, run_id: str, upto: int, keep_last: int) -> tuple[list[dict], list[dict]]:
    """What retention deletes after iteration `upto`: (checkpoints whose adapter directory goes, checkpoints whose
    optimizer state alone goes), each a row with iteration and adapter_path (as stored). Of the trained checkpoints
    up to `upto`, the adapter stays for the best and the last `keep_last`, the optimizer state for the last
    `OPTIMIZERS_KEPT` whose adapters stay; what is already deleted and every later iteration are left out (a
    resumed run passing an earlier iteration again deletes nothing a later one still needs)."""
    rows = wh.rows("""
        SELECT iteration, adapter_path, is_best, adapter_pruned_at IS NULL AS has_adapter,
               optimizer_pruned_at IS NULL AS has_optimizer, row_number() OVER (ORDER BY iteration DESC) AS newest
        FROM checkpoints WHERE run_id = ? AND iteration <= ? AND adapter_path <> ?
        ORDER BY iteration""", [run_id, upto, BASE])
    adapters = [r for r in rows if r["has_adapter"] and not r["is_best"] and r["newest"] > keep_last]
    going = {r["iteration"] for r in adapters}
    optimizers = [r for r in rows if r["has_optimizer"] and r["iteration"] not in going
                  and r["newest"] > OPTIMIZERS_KEPT]
    return adapters, optimizers


def record_pruned(wh: Warehouse, run_id: str, adapters: list[int], optimizers: list[int]) -> None:
    """Record that retention deleted the adapters (with their optimizer state) of iterations `adapters` and the
    optimizer state alone of iterations `optimizers`, in one transaction."""
    with wh.transaction():
        wh.execute("UPDATE checkpoints SET adapter_pruned_at = now(), optimizer_pruned_at = "
                   "coalesce(optimizer_pruned_at, now()) WHERE run_id = ? AND list_contains(?::INTEGER[], iteration)",
                   [run_id, adapters])
        wh.execute("UPDATE checkpoints SET optimizer_pruned_at = now() WHERE run_id = ? "
                   "AND list_contains(?::INTEGER[], iteration)", [run_id, optimizers])


def check_retained(wh: Warehouse, run_id: str, iteration: int, stage: str) -> None:
    """Refuse (`CheckpointPruned`) a stage about to run that would read what retention deleted: validation of
    iteration k reads k's adapter; any other stage of iteration k >= 2 generates with k-1's adapter or is followed
    by k's train stage (a redo makes it stale), which starts from k-1's adapter and optimizer state."""
    if stage == Stage.VALIDATE:
        source, column, needs = iteration, "adapter_pruned_at", f"it answers with iteration {iteration}'s adapter"
    elif stage in ORDER and iteration >= 2:
        source, column = iteration - 1, "optimizer_pruned_at"
        needs = (f"the iteration's train stage, which a redo of any of its stages runs again, starts from iteration "
                 f"{source}'s adapter and optimizer state")
    else:
        return
    found = wh.rows("SELECT adapter_pruned_at, optimizer_pruned_at FROM checkpoints WHERE run_id = ? AND iteration = ?",
                    [run_id, source])
    if not found or found[0][column] is None:
        return
    what = "adapter (with its optimizer state)" if found[0]["adapter_pruned_at"] is not None else "optimizer state"
    raise CheckpointPruned(
        f"stage {stage} of run {run_id!r} iteration {iteration} cannot run: {needs}, and checkpoint retention deleted "
        f"iteration {source}'s {what} on {found[0][column]:%Y-%m-%d %H:%M} ({RULE}). Nothing was written. The newest "
        f"iteration's stages stay redoable with train.keep_last at 2 or more; to redo older ones, start a new run "
        f"(--run NAME) with --set train.keep_last=null, which keeps everything")
