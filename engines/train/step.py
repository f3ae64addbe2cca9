"""One TRR++ policy-gradient step on the shared LoRA adapter, through TRL's `GRPOTrainer`, on stored rows.

SAGE scores and normalises advantages itself (TRR++: per role), so TRL must neither generate nor score nor
re-normalise anything. This module holds the rows (`TrainRow`, `read_rows` / `write_rows`), model loading
(`load_policy`, `lora_config`), the step (`train_step`, `train_model`) and the `python -m sage.engines.train.step` entry
point. The TRL machinery (`StoredRowsTrainer`, its block sampler, `_build_trainer`) is in `sage.engines.train.trl_trainer`;
`sage.engines.train.step.StoredRowsTrainer` still works, built lazily because `from trl import GRPOTrainer` takes seconds.

Semantics of one `train_step`: one pass over all rows with a non-empty completion; one optimizer update per
block of `cfg.minibatch_size * cfg.grad_accum` rows (per process), i.e. `ceil(n_rows / (minibatch_size *
grad_accum * processes))` updates; constant learning rate, AdamW, fresh optimizer state every step (the adapter
is the only state carried from one iteration to the next). With the default `dapo` loss the update is the
token-level mean of the clipped policy-gradient loss over all completion tokens of the block.

Under `accelerate launch` (N processes, the train stage's `train.accelerate_config`) every process reads all
rows and draws the same seeded order; process k trains on the k-th slice of each block, and the gradients
are averaged. TRL's `dapo` divides each process's token sum by (block tokens / N), `grpo` and `dr_grpo` by
the rows of a micro-batch (dummy padding rows included, so every process has the same count): after
averaging over N, N processes with `minibatch_size` b give the update one process gives with N*b (measured:
equal within float rounding). `bnpo` divides by the tokens of each process's own micro-batch, so its
update depends on the split. Only the main process saves the adapter and writes the metrics, which record
the rows each process trained on (`rows_by_rank`).

`python -m sage.engines.train.step --in rows.parquet --out ADAPTER --model PATH --config JSON` runs the same step in its
own process (the train stage does that when `train.isolate` is set, or under `accelerate launch`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sage.configs.schema import TrainConfig
from sage.engines.train.trl_trainer import BATCH_KEYS, OPTIONAL_BATCH_KEYS, _build_trainer, _trainer_class  # noqa: F401

#: File written next to the adapter weights, with the metrics of the step that produced them.
METRICS_FILE = "sage_train_metrics.json"


@dataclass
class TrainRow:
    """One scored rollout, as stored: token ids, its TRR++ advantage, optionally its sampling log-probs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    logprobs: list[float] | None = None  # sampling log-probs of the completion tokens, when stored
    role: str = ""


# --------------------------------------------------------------------------------------------------------------
# Planning helpers (no torch / TRL needed)


def rows_per_update(cfg: TrainConfig, num_processes: int = 1) -> int:
    """Rows in one optimizer update (one TRL generation batch)."""
    return cfg.minibatch_size * cfg.grad_accum * num_processes


def num_updates(n_rows: int, cfg: TrainConfig, num_processes: int = 1) -> int:
    """Optimizer updates one `train_step` makes over `n_rows` usable rows."""
    return math.ceil(n_rows / rows_per_update(cfg, num_processes)) if n_rows > 0 else 0


def _check_rows(rows: list[TrainRow]) -> None:
    for i, r in enumerate(rows):
        if len(r.prompt_ids) == 0:
            raise ValueError(f"row {i}: empty prompt_ids")
        if r.logprobs is not None and len(r.logprobs) != len(r.completion_ids):
            raise ValueError(f"row {i}: {len(r.logprobs)} logprobs for {len(r.completion_ids)} completion tokens")
        if not math.isfinite(float(r.advantage)):
            raise ValueError(f"row {i}: advantage {r.advantage!r} is not finite")


def _role_means(rows: list[TrainRow]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for r in rows:
        sums.setdefault(r.role, []).append(float(r.advantage))
    return {role: sum(v) / len(v) for role, v in sorted(sums.items())}


def __getattr__(name: str):  # `sage.engines.train.step.StoredRowsTrainer` without importing TRL at module import
    if name == "StoredRowsTrainer":
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------------------------
# train_step


@contextlib.contextmanager
def _quiet_v6():
    """transformers 5 renamed gradient_checkpointing (FutureWarning); peft 0.21 and TRL 1.16 use the old names."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*will be removed in v6.*", category=FutureWarning)
        yield


def resolve_device(device: str | None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str):
    """`auto`: bfloat16 on a CUDA device or CPU that supports it natively, else float32. The LoRA weights
    stay float32 either way (peft upcasts adapters), so only the frozen base runs in bf16."""
    import torch

    from sage.engines.llm.models import cpu_supports_bf16

    if dtype == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if cpu_supports_bf16() else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r}: use auto, float32 or bfloat16")
    return table[dtype]


def lora_config(cfg: TrainConfig):
    """The adapter every iteration trains: LoRA on all linear layers (not the LM head), no modules_to_save, no DoRA."""
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear", bias="none", task_type="CAUSAL_LM", use_dora=False,
                      modules_to_save=None)


def load_policy(model_path: str, adapter_in: str | None, cfg: TrainConfig, *, seed: int = 0,
                dtype: Any = None):
    """Base model + trainable LoRA: `adapter_in` if given, else a fresh adapter from `cfg` (seeded)."""
    import torch
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, set_seed

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype or torch.float32)
    set_seed(seed)
    with _quiet_v6():
        if adapter_in:
            return PeftModel.from_pretrained(model, adapter_in, is_trainable=True)
        return get_peft_model(model, lora_config(cfg))


def _atomic_save(model, adapter_out: str | os.PathLike, metrics: dict, state_dict: dict | None = None) -> Path:
    out = Path(adapter_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, selected_adapters=["default"], state_dict=state_dict)
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True))
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def train_step(model_path: str, adapter_in: str | None, adapter_out: str, rows: list[TrainRow], cfg: TrainConfig,
               *, seed: int = 0, device: str | None = None, dtype: str = "auto", temperature: float = 1.0) -> dict:
    """Train the shared LoRA adapter once over `rows` and save it to `adapter_out` (atomically).

    Loads `model_path` (+ `adapter_in`, trainable; else a fresh LoRA from `cfg`, seeded by `seed`), makes one pass
    over every row with a non-empty completion, one optimizer update per `cfg.minibatch_size * cfg.grad_accum`
    rows (per process; the last update may cover fewer), and saves the adapter (plus `sage_train_metrics.json`)
    to `adapter_out` through a temp dir + rename, replacing an existing directory. `dtype="auto"` is bfloat16 on
    CUDA, float32 on CPU. `temperature` divides the logits in the loss: set it to the sampling temperature when
    the stored log-probs were taken at that temperature. With no usable row the adapter is saved unchanged.
    Under `accelerate launch` every process calls this with the same rows; only the main process saves.

    Returns the metrics of `train_model`, plus total_seconds (with loading and saving).
    """
    t_start = time.perf_counter()
    from accelerate import PartialState

    device = resolve_device(device)
    # Launched on CPUs, a process joins a gloo group only when its first PartialState is told the device is
    # the CPU; build it here so that also holds when no Trainer (which would say so too) is ever made.
    PartialState(cpu=device.startswith("cpu"))
    model = load_policy(model_path, adapter_in, cfg, seed=seed, dtype=resolve_dtype(dtype, device))
    metrics, full_state = _train(model, model_path, rows, cfg, seed=seed, device=device, temperature=temperature)
    metrics["total_seconds"] = time.perf_counter() - t_start
    state = PartialState()
    if state.is_main_process:
        _atomic_save(model, adapter_out, metrics, state_dict=full_state)
    state.wait_for_everyone()  # no process returns (and exits) before the adapter exists
    return metrics


def train_model(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int = 0,
                device: str | None = None, temperature: float = 1.0) -> dict:
    """Train an already loaded `PeftModel` in place, one pass over `rows` (see `train_step`); return metrics.

    Metrics: loss, grad_norm, grad_norm_max, clip_fraction, entropy (means over updates of what TRL logs; None
    when not logged), tokens (prompt + completion tokens of the rows used), completion_tokens, n_rows (used),
    n_skipped (empty completions), n_updates, seconds (the training loop only, wall clock), cpu_seconds (its
    process CPU time, all threads), tokens_per_s (tokens / seconds),
    adv_mean_by_role ({role: mean advantage}), used_logprobs (every row had stored log-probs), device, dtype,
    lr, loss_type, seed, num_processes, distributed (accelerate's name for the setup: NO, MULTI_GPU,
    MULTI_CPU, FSDP, DEEPSPEED), rows_by_rank (per process, the indices into `rows` it trained on, in order),
    steps (TRL's per-update logs).
    """
    return _train(model, tokenizer_path, rows, cfg, seed=seed, device=device, temperature=temperature)[0]


def _sharded_state_dict(trainer) -> dict | None:
    """The whole state dict when the weights are sharded over processes (FSDP, DeepSpeed ZeRO-3), else None
    (every process then holds whole weights in `model`). Every process must call it: it gathers."""
    from accelerate.utils import DistributedType

    acc = trainer.accelerator
    zero3 = (acc.distributed_type == DistributedType.DEEPSPEED
             and getattr(acc.state.deepspeed_plugin, "zero_stage", None) == 3)
    if acc.distributed_type == DistributedType.FSDP or zero3:
        return acc.get_state_dict(trainer.model_wrapped)
    return None


def _train(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int, device: str | None,
           temperature: float) -> tuple[dict, dict | None]:
    """`train_model`, plus the gathered state dict for saving when the weights are sharded (else None)."""
    from accelerate import PartialState
    from accelerate.utils import gather_object

    used_at = [i for i, r in enumerate(rows) if len(r.completion_ids) > 0]
    usable = [rows[i] for i in used_at]
    _check_rows(usable)
    device = resolve_device(device)
    torch_dtype = model.get_base_model().dtype
    state = PartialState()
    processes = state.num_processes
    metrics = {
        "n_rows": len(usable), "n_skipped": len(rows) - len(usable),
        "tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in usable),
        "completion_tokens": sum(len(r.completion_ids) for r in usable),
        "adv_mean_by_role": _role_means(usable),
        "used_logprobs": bool(usable) and all(r.logprobs is not None for r in usable),
        "device": device, "dtype": str(torch_dtype).removeprefix("torch."),
        "lr": cfg.lr, "loss_type": cfg.loss_type, "seed": seed, "num_processes": processes,
        "distributed": state.distributed_type.value,
        "loss": None, "grad_norm": None, "grad_norm_max": None, "clip_fraction": None, "entropy": None,
        "n_updates": 0, "seconds": 0.0, "cpu_seconds": 0.0, "tokens_per_s": 0.0, "steps": [],
        "rows_by_rank": [[] for _ in range(processes)],
    }
    if not usable:  # nothing to learn from: the adapter goes on unchanged
        return metrics, None
    if processes > 1 and cfg.loss_type == "bnpo":
        warnings.warn("train.loss_type bnpo divides by the tokens of each process's own micro-batch, so its update "
                      "changes with the number of processes; dapo, grpo and dr_grpo do not", stacklevel=2)
    with _quiet_v6():
        trainer, steps = _build_trainer(model, tokenizer_path, usable, cfg, seed=seed, device=device,
                                        torch_dtype=torch_dtype, temperature=temperature)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.train()
            seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
            # Collectives: every process reaches them, right after training.
            rows_by_rank = gather_object([[used_at[i] for i in trainer.sage_seen]])
            full_state = _sharded_state_dict(trainer)
        finally:
            shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
    metrics.update({
        "loss": _mean([s.get("loss") for s in steps]),
        "grad_norm": _mean([s.get("grad_norm") for s in steps]),
        "grad_norm_max": max((s["grad_norm"] for s in steps if s.get("grad_norm") is not None), default=None),
        "clip_fraction": _mean([s.get("clip_ratio/region_mean") for s in steps]),
        "entropy": _mean([s.get("entropy") for s in steps]),
        "n_updates": trainer.state.global_step,
        "num_processes": trainer.accelerator.num_processes,
        "distributed": trainer.accelerator.distributed_type.value,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "tokens_per_s": metrics["tokens"] / seconds if seconds > 0 else 0.0,
        "steps": steps,
        "rows_by_rank": rows_by_rank,
    })
    return metrics, full_state


# --------------------------------------------------------------------------------------------------------------
# Subprocess entry point


def read_rows(path: str | os.PathLike) -> list[TrainRow]:
    """Rows from a Parquet file with columns prompt_ids, completion_ids, advantage[, logprobs, role]."""
    import pyarrow.parquet as pq

    out = []
    for rec in pq.read_table(path).to_pylist():
        logprobs = rec.get("logprobs")
        out.append(TrainRow(prompt_ids=[int(t) for t in rec["prompt_ids"]],
                            completion_ids=[int(t) for t in (rec["completion_ids"] or [])],
                            advantage=float(rec["advantage"]),
                            logprobs=None if logprobs is None else [float(x) for x in logprobs],
                            role=rec.get("role") or ""))
    return out


def write_rows(rows: list[TrainRow], path: str | os.PathLike) -> None:
    """Write rows in the format `read_rows` (and `python -m sage.engines.train.step --in`) reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "prompt_ids": pa.array([r.prompt_ids for r in rows], type=pa.list_(pa.int64())),
        "completion_ids": pa.array([r.completion_ids for r in rows], type=pa.list_(pa.int64())),
        "advantage": pa.array([float(r.advantage) for r in rows], type=pa.float64()),
        "logprobs": pa.array([r.logprobs for r in rows], type=pa.list_(pa.float64())),
        "role": pa.array([r.role for r in rows], type=pa.string()),
    })
    pq.write_table(table, path)


def _load_config(value: str) -> TrainConfig:
    text = Path(value).read_text() if not value.lstrip().startswith("{") and Path(value).is_file() else value
    return TrainConfig.model_validate(json.loads(text))


def train_main(argv: list[str] | None = None) -> int:
    """`python -m sage.engines.train.step --in rows.parquet --out ADAPTER --model PATH --config JSON [--metrics FILE]`."""
    ap = argparse.ArgumentParser(prog="python -m sage.engines.train.step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="rows", required=True, help="Parquet rows (prompt_ids, completion_ids, advantage, "
                    "logprobs, role)")
    ap.add_argument("--out", required=True, help="adapter directory to write (replaced atomically)")
    ap.add_argument("--model", required=True, help="base model directory")
    ap.add_argument("--config", required=True, help="TrainConfig as a JSON string or a JSON file")
    ap.add_argument("--adapter-in", default=None, help="adapter to continue training (default: a fresh LoRA)")
    ap.add_argument("--metrics", default=None, help="write the metrics JSON here too")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--temperature", type=float, default=1.0)
    a = ap.parse_args(argv)
    from accelerate import PartialState

    try:
        metrics = train_step(a.model, a.adapter_in, a.out, read_rows(a.rows), _load_config(a.config),
                             seed=a.seed, device=a.device, dtype=a.dtype, temperature=a.temperature)
        if a.metrics and PartialState().is_main_process:
            path = Path(a.metrics)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True))
            os.replace(tmp, path)
    finally:
        # Under `accelerate launch` this process owns a process group: leave it explicitly (torch warns, and
        # NCCL may hang at exit, otherwise). Without a launcher there is none and this does nothing.
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(train_main(sys.argv[1:]))
