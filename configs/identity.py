"""A run's identity: the config fields that decide which rows a run writes.

`sage run` names a run `run-<config_hash>`, and an existing run resumes only with the same identity. Fields
that only say how long, where or how fast a run executes stay out of it (`EXCLUDED`, each with its reason),
so `--set run.iterations=5` or `-n 5` extends the same run, and a run started locally resumes on Ray. Every
other field (model, seeds, roles, iteration sizes, rewards, training hyper-parameters, the validation set)
decides rows, and a change to one is refused with the list of fields that differ. A field added to the schema
later stays out of the hash at the value every earlier run computed with (`ADDED`), so run ids outlive the addition;
tests/configs/test_identity_contract.py fails on a schema field in none of these lists nor hashed from the start.
"""
# pyright: basic

from __future__ import annotations

import hashlib
import json

from sage.configs.schema import SageConfig

# "section" or "section.field": why it does not change any row.
EXCLUDED: dict[str, str] = {
    "run.dir": "where the warehouse and adapters live, not what they hold",
    "run.iterations": "how long the run goes; a larger value extends the same run",
    "run.batch_rows": "rows per commit; the rows themselves are the same",
    "model.cache_dir": "where converted base weights are cached",
    "model.token_budget": "how generation requests are packed into batches (hf)",
    "model.tensor_parallel_size": "GPUs per vLLM engine: placement",
    "model.data_parallel_size": "vLLM engine replicas: placement",
    "model.gpu_memory_utilization": "share of GPU memory vLLM takes: placement",
    "model.max_lora_rank": "the largest adapter vLLM accepts; train.lora_rank decides the adapter",
    "train.isolate": "training in its own process or in the flow's: same update",
    "train.keep_last": "how many old adapters stay on disk, not what any iteration computes",
    "train.gradient_checkpointing": "recompute activations to save memory: same update",
    "validate.every": "the validation schedule; the validation set stays in the identity",
    "validate.patience": "when early stopping ends the run, not what an iteration computes",
    "validate.pipeline": "adds the pipeline's validation beside the plain one, which decides early stopping",
    "sandbox.backend": "which isolation runs the code; the limits that decide verdicts stay in",
    "sandbox.workers": "how many executions run at once",
    "orchestration": "where fan-out work runs (local pools or Ray): the same rows either way",
}


#: Fields the schema no longer has (finished experiments; docs/decisions.md, "Removed options") -> the value every
#: run recorded with them computed its rows under today's code with, and whether the field was in the identity.
#: A stored config holding that value loads as if the field were absent; the identity keeps the identity ones at
#: that value, so run ids and resumes are what they were before the removal.
RETIRED: dict[str, tuple[object, bool]] = {
    "model.compile": (False, True),
    "train.update_order": ("shuffled", True),
    "train.share_prefix": (False, False),
}


#: Fields added after runs were recorded -> the value under which every run recorded before them computed its rows.
#: At that value a field stays out of the hash, so adding it leaves every existing run id as it was (`sage run`
#: with an unchanged profile still finds its run); any other value is part of the hash, so a run with the field
#: changed is another run. A stored config without the field reads as that value (`identity`).
ADDED: dict[str, object] = {
    "iteration.challenger": True,
    "iteration.planner": True,
    "roles.prompts": "short",
    "seeds.sets": [],
    "train.old_policy": "auto",
    "train.importance_correction": True,
    "train.importance_cap": 3.0,
    "train.role_shares": None,
    "train.hinted_prompt": "shown",
    "iteration.hints": "always",
    "iteration.hint_share": 0.5,
    "train.adapters": "shared",
    "iteration.generated_share": 0.0,
    "iteration.admission": "quality",
    "iteration.band_low": 0.3,
    "iteration.band_high": 0.7,
    "rewards.challenger_difficulty": "difficulty",
    "rewards.repetition_weight": 1.0,
    "rewards.repetition_similarity": 0.5,
    "seeds.heldout": [],
}


def drop_retired(data: dict) -> dict:
    """`data` (a config as a nested dict, from a stored run or a profile) without the `RETIRED` fields. Raises
    ValueError for one set to anything else: what it asked for no longer exists."""
    data = json.loads(json.dumps(data))
    for key, (value, _) in RETIRED.items():
        section, _, field = key.partition(".")
        if isinstance(data.get(section), dict) and field in data[section]:
            stored = data[section].pop(field)
            if stored != value:
                raise ValueError(f"{key} = {json.dumps(stored)} names an option that was removed (docs/decisions.md, "
                                 f"'Removed options'); delete it from the profile, or start a new run without it")
    return data


def identity(cfg: SageConfig | dict) -> dict:
    """The config as a nested dict without the `EXCLUDED` fields (the identity `RETIRED` fields at their value, an
    `ADDED` field a stored config lacks at its value)."""
    data = cfg.model_dump(mode="json") if isinstance(cfg, SageConfig) else json.loads(json.dumps(cfg))
    for key, (value, kept) in RETIRED.items():
        section, _, field = key.partition(".")
        if isinstance(data.get(section), dict):
            if kept:
                data[section].setdefault(field, value)
            else:
                data[section].pop(field, None)
    for key, value in ADDED.items():
        section, _, field = key.partition(".")
        if isinstance(data.get(section), dict):
            data[section].setdefault(field, value)
    validate, roles = data.get("validate"), data.get("roles")
    if isinstance(validate, dict) and validate.get("max_new_tokens") is None and isinstance(roles, dict):
        # null means the Solver's length: hashed as that number, which every run before null existed stored
        validate["max_new_tokens"] = (roles.get("solver") or {}).get("max_new_tokens")
    for key in EXCLUDED:
        section, _, field = key.partition(".")
        if field:
            data.get(section, {}).pop(field, None)
        else:
            data.pop(section, None)
    return data


def config_hash(cfg: SageConfig | dict) -> str:
    """The hash of `identity`, with each `ADDED` field left out at its value."""
    data = identity(cfg)
    for key, value in ADDED.items():
        section, _, field = key.partition(".")
        if isinstance(data.get(section), dict) and data[section].get(field) == value:
            del data[section][field]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def identity_diff(stored: SageConfig | dict, new: SageConfig | dict) -> list[str]:
    """`section.field: stored -> new` for every identity field that differs."""
    a, b = identity(stored), identity(new)
    out = []
    for section in sorted(set(a) | set(b)):
        x, y = a.get(section), b.get(section)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [_line(f"{section}.{f}", x.get(f), y.get(f))
                    for f in sorted(set(x) | set(y)) if x.get(f) != y.get(f)]
        elif x != y:
            out.append(_line(section, x, y))
    return out


def _line(name: str, old, new) -> str:
    return f"{name}: {json.dumps(old)} -> {json.dumps(new)}"
