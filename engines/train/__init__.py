"""Training the shared LoRA adapter on stored rows: the rows and their Parquet file (`rows`), one TRR++
policy-gradient step (`step`) through a TRL `GRPOTrainer` subclass (`trainer`) that scores each row's completion
at its own sampling temperature (`logprobs`, with the CPU training attention of `attention`), run in this
process, in its own or under `accelerate launch` (`launch`, which starts `python -m sage.engines.train`), and
merging an adapter into its base model for serving (`merge`).

Importing this package, `rows` or `launch` loads neither torch nor TRL; `step` and `trainer` load both."""

from __future__ import annotations

from os import PathLike
from pathlib import Path

#: File written next to the adapter weights, with the metrics of the step that produced them.
METRICS_FILE = "sage_train_metrics.json"
#: File written next to the adapter weights: AdamW's state (moments, step count) and the scheduler's, which the
#: next iteration's step loads (SAGE.md step 11: the optimizer state carries from iteration to iteration). Not
#: part of what serves the adapter: `sage export` leaves it out, checkpoint retention deletes it first.
OPTIMIZER_FILE = "sage_optimizer.pt"
#: The folder inside a checkpoint's adapter directory that holds the other roles' own adapters under
#: `train.adapters` per_role (the directory itself is the Solver's adapter): `roles/<role>`.
ROLES_DIR = "roles"


def role_adapter_dir(adapter_dir: str | PathLike[str], role: str) -> Path:
    """Where `role`'s own adapter of a checkpoint lives under `train.adapters` per_role: the Solver's is the
    checkpoint's adapter directory itself (what validation, `sage eval` and `sage export` read), another role's
    `<adapter_dir>/roles/<role>`."""
    return Path(adapter_dir) if role == "solver" else Path(adapter_dir) / ROLES_DIR / str(role)
