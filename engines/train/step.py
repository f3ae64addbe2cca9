"""One TRR++ policy-gradient step on the shared LoRA adapter, through TRL's `GRPOTrainer`, on stored rows.

This module loads the policy (`load_policy`: base model + LoRA from `lora_config`), runs the step (`train_step`,
which loads and saves; `train_model`, on a model already loaded) and saves the adapter atomically. The rows are
`sage.engines.train.rows`; the TRL subclass that consumes them is `sage.engines.train.trl_trainer`; the command
line that runs a step in its own process is `python -m sage.engines.train`.

Semantics of one `train_step`: one pass over all rows with a non-empty completion; one optimizer update per
block of `cfg.minibatch_size * cfg.grad_accum` rows (per process), i.e. `ceil(n_rows / (minibatch_size *
grad_accum * processes))` updates; constant learning rate, AdamW. The optimizer and scheduler state (AdamW's
moments and step count) is saved beside the adapter (`OPTIMIZER_FILE`) and loaded by the next step that starts
from that adapter, so the optimisation continues across iterations, and a step re-run after a crash starts
from the same state and gives the same adapter. With the default `dapo` loss and `role_mean` weighting the
update is the mean over roles of each role's token mean of the clipped policy-gradient loss over the block;
with `token_mean`, the token mean over all completion tokens of the block.

Under `accelerate launch` (N processes, the train stage's `train.accelerate_config`) every process reads all
rows and draws the same seeded order; process k trains on the k-th slice of each block, and the gradients
are averaged. TRL's `dapo` divides each process's token sum by (block tokens / N), `grpo` and `dr_grpo` by
the rows of a micro-batch (dummy padding rows included, so every process has the same count): after
averaging over N, N processes with `minibatch_size` b give the update one process gives with N*b (equal
within float rounding). `bnpo` divides by the tokens of each process's own micro-batch, so its update
depends on the split. Only the main process saves the adapter and writes the metrics, which record the rows
each process trained on (`rows_by_rank`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from sage.configs.schema import TrainConfig
from sage.engines.llm.models import bounded_heap, quiet_v6, resolve_dtype
from sage.engines.train.rows import TrainRow, check_rows
from sage.engines.train.build import build_trainer

#: File written next to the adapter weights, with the metrics of the step that produced them.
METRICS_FILE = "sage_train_metrics.json"
#: File written next to the adapter weights: AdamW's state (moments, step count) and the scheduler's, which the
#: next iteration's step loads (SAGE.md step 11: the optimizer state carries from iteration to iteration).
OPTIMIZER_FILE = "sage_optimizer.pt"


def load_optimizer_state(adapter_dir: str | os.PathLike | None) -> dict | None:
    """The optimizer and scheduler state saved beside an adapter, or None (no adapter, or one saved without it)."""
    if not adapter_dir or not (Path(adapter_dir) / OPTIMIZER_FILE).is_file():
        return None
    import torch

    return torch.load(Path(adapter_dir) / OPTIMIZER_FILE, map_location="cpu", weights_only=True)


def _role_means(rows: list[TrainRow]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for r in rows:
        sums.setdefault(r.role, []).append(float(r.advantage))
    return {role: sum(v) / len(v) for role, v in sorted(sums.items())}


def resolve_device(device: str | None) -> str:
    """`device` as given, else "cuda" when there is a GPU, else "cpu"."""
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


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
    with quiet_v6():
        if adapter_in:
            return PeftModel.from_pretrained(model, adapter_in, is_trainable=True)
        return get_peft_model(model, lora_config(cfg))


def _atomic_save(model, adapter_out: str | os.PathLike, metrics: dict, state_dict: dict | None = None,
                 optimizer_state: dict | None = None) -> Path:
    out = Path(adapter_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, selected_adapters=["default"], state_dict=state_dict)
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True))
        if optimizer_state is not None:
            import torch

            torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
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
               *, seed: int = 0, device: str | None = None, dtype: str = "auto",
               on_step: Callable[[dict], None] | None = None) -> dict:
    """Train the shared LoRA adapter once over `rows` and save it to `adapter_out` (atomically).

    Loads `model_path` (+ `adapter_in`, trainable; else a fresh LoRA from `cfg`, seeded by `seed`), makes one pass
    over every row with a non-empty completion, one optimizer update per `cfg.minibatch_size * cfg.grad_accum`
    rows (per process; the last update may cover fewer), and saves the adapter (plus `sage_train_metrics.json`)
    to `adapter_out` through a temp dir + rename, replacing an existing directory. `dtype` is resolved by
    `sage.engines.llm.models.resolve_dtype` for the frozen base; the LoRA weights stay float32 either way
    (peft upcasts adapters). Each row's log-probs are taken at its own sampling temperature (`TrainRow.temperature`).
    With no usable row the adapter is saved unchanged. `on_step` is called on the main process as each
    optimizer update ends, with that update's `updates.step_record` (step, updates, loss, grad_norm,
    entropy, clip_fraction, learning_rate, tokens, seconds): the train stage stores it as training goes.
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
    carried = load_optimizer_state(adapter_in)
    metrics, full_state, opt_state = _train(model, model_path, rows, cfg, seed=seed, device=device,
                                            optimizer_state=carried, on_step=on_step)
    metrics["total_seconds"] = time.perf_counter() - t_start
    state = PartialState()
    if state.is_main_process:
        _atomic_save(model, adapter_out, metrics, state_dict=full_state,
                     optimizer_state=opt_state if opt_state is not None else carried)
    state.wait_for_everyone()  # no process returns (and exits) before the adapter exists
    return metrics


def train_model(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int = 0,
                device: str | None = None, on_step: Callable[[dict], None] | None = None) -> dict:
    """Train an already loaded `PeftModel` in place, one pass over `rows` (see `train_step`); return metrics.

    Metrics: loss, grad_norm, grad_norm_max, clip_fraction, entropy (means over updates of what TRL logs; None
    when not logged), tokens (prompt + completion tokens of the rows used), completion_tokens, n_rows (used),
    n_skipped (empty completions), n_updates, prefix_tokens_saved (prompt tokens not recomputed because rows of an
    update shared them: `train.share_prefix`), seconds (the training loop only, wall clock), cpu_seconds (its
    process CPU time, all threads), tokens_per_s (tokens / seconds),
    adv_mean_by_role ({role: mean advantage}), used_logprobs (every row had stored sampling log-probs, taken
    as the behaviour policy's), temperatures ({role: temperature}), device, dtype,
    lr, loss_type, seed, num_processes, distributed (accelerate's name for the setup: NO, MULTI_GPU,
    MULTI_CPU, FSDP, DEEPSPEED), rows_by_rank (per process, the indices into `rows` it trained on, in order),
    steps (TRL's per-update logs).
    """
    return _train(model, tokenizer_path, rows, cfg, seed=seed, device=device, on_step=on_step)[0]


def _optimizer_state(trainer) -> dict | None:
    """The trainer's optimizer and scheduler state on the CPU; None when the optimizer is sharded over
    processes (FSDP, DeepSpeed), whose state this module does not gather."""
    from accelerate.utils import DistributedType

    if trainer.accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return None
    import torch

    def cpu(x):
        if isinstance(x, torch.Tensor):
            return x.detach().cpu().clone()
        if isinstance(x, dict):
            return {k: cpu(v) for k, v in x.items()}
        if isinstance(x, list):
            return [cpu(v) for v in x]
        return x

    return {"optimizer": cpu(trainer.optimizer.state_dict()), "scheduler": cpu(trainer.lr_scheduler.state_dict())}


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
           optimizer_state: dict | None = None,
           on_step: Callable[[dict], None] | None = None) -> tuple[dict, dict | None, dict | None]:
    """`train_model`, plus the gathered state dict for saving when the weights are sharded (else None) and the
    optimizer and scheduler state after training (None when nothing trained or the optimizer is sharded)."""
    from accelerate import PartialState
    from accelerate.utils import gather_object

    used_at = [i for i, r in enumerate(rows) if len(r.completion_ids) > 0]
    usable = [rows[i] for i in used_at]
    check_rows(usable)
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
        "temperatures": {r.role: r.temperature for r in usable},
        "device": device, "dtype": str(torch_dtype).removeprefix("torch."),
        "lr": cfg.lr, "loss_type": cfg.loss_type, "seed": seed, "num_processes": processes,
        "distributed": state.distributed_type.value,
        "loss": None, "grad_norm": None, "grad_norm_max": None, "clip_fraction": None, "entropy": None,
        "n_updates": 0, "prefix_tokens_saved": 0, "seconds": 0.0, "cpu_seconds": 0.0, "tokens_per_s": 0.0, "steps": [],
        "rows_by_rank": [[] for _ in range(processes)],
    }
    if not usable:  # nothing to learn from: the adapter goes on unchanged
        return metrics, None, None
    if processes > 1 and cfg.loss_type == "bnpo":
        warnings.warn("train.loss_type bnpo divides by the tokens of each process's own micro-batch, so its update "
                      "changes with the number of processes; dapo, grpo and dr_grpo do not", stacklevel=2)
    with quiet_v6(), bounded_heap(None if cfg.mmap_threshold_kb is None else cfg.mmap_threshold_kb << 10):
        trainer, steps = build_trainer(model, tokenizer_path, usable, cfg, seed=seed, device=device,
                                        torch_dtype=torch_dtype,
                                        optimizer_state=optimizer_state, on_step=on_step)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.train()
            seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
            # Collectives: every process reaches them, right after training.
            rows_by_rank = gather_object([[used_at[i] for i in trainer.sage_seen]])
            full_state = _sharded_state_dict(trainer)
            opt_state = _optimizer_state(trainer)
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
        "optimizer_steps": _adam_steps(opt_state),
        "prefix_tokens_saved": trainer.sage_prefix_tokens_saved,
        "loss_weighting": cfg.loss_weighting,
    })
    return metrics, full_state, opt_state


def _adam_steps(opt_state: dict | None) -> int | None:
    """AdamW's step count after this training (all iterations so far), from its saved state."""
    if not opt_state or not opt_state["optimizer"]["state"]:
        return None
    return int(float(next(iter(opt_state["optimizer"]["state"].values()))["step"]))
