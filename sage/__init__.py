"""SAGE: multi-agent self-evolution (Challenger, Planner, Critic, Solver) with external verifiers and TRR++.

The installed package is `sage`; its sub-packages are the repository's top-level folders, linked here:
`sage/flows` is `flows/`, `sage/stages` is `stages/`, `sage/engines` is `engines/`, `sage/warehouse` is
`warehouse/`, `sage/configs` is `configs/`. Imports only point down that list (DESIGN.md's layers). The links
make the package a plain folder, so setuptools, editors and type checkers resolve `sage.*` the same way
(docs/decisions.md). This folder holds nothing else but the process settings below, which must be in place
before torch or huggingface_hub is first imported.
"""

import os as _os

# OpenMP threads wait passively and number the cores this process may run on, unless the user said otherwise.
# torch's default spin-wait collapses when anything else runs, and the pipeline always runs beside its own
# Prefect server, math workers and sandbox children: a decode-like loop measured 55x slower spinning than
# passive under load (`python bench/threads.py`). Set here, before any sub-package can import torch: the
# OpenMP runtime reads these once, when it starts.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if hasattr(_os, "sched_getaffinity"):
    _os.environ.setdefault("OMP_NUM_THREADS", str(len(_os.sched_getaffinity(0))))

# No usage pings: TRL's trainer sends one to the Hugging Face Hub each time it is built (every iteration's train
# stage) unless telemetry is off. A training run on a cluster node or a laptop makes no network calls it did
# not ask for; a user who wants to send them sets HF_HUB_DISABLE_TELEMETRY=0.
_os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
