"""One TRR++ policy-gradient step on the shared LoRA adapter through the stored-rows trainer (`trainer`): load the
policy (`load_policy`), train it once over the rows (`train_model`; `train_step` also loads and saves), and save
the adapter atomically with its metrics and the optimizer state.

One step is one pass over the rows with a non-empty completion, one AdamW update (constant learning rate) per
block of `minibatch_size * grad_accum * processes` rows. With the default `dapo` loss and `role_share` weighting
each role's tokens together weigh its share (`train.role_shares`, equal by default) of the clipped policy-gradient
loss summed over the pass's updates, however its rows fall into blocks; with `role_mean`, each update is the mean
over roles of each role's token mean over its block; with `token_mean`, the token mean over the block's completion
tokens. The optimizer and scheduler state is saved
beside the adapter (`OPTIMIZER_FILE`) and loaded by the next step that starts from it (SAGE.md step 11), so a
step re-run after a crash starts from the same state and gives the same adapter.

Under `accelerate launch` (N processes) every process reads all rows and draws the same seeded order; process k
trains on the k-th slice of each block, and the gradients are averaged: `dapo`, `grpo` and `dr_grpo` give the
update one process gives with N times the batch (within float rounding); `bnpo` divides by each process's own
tokens, so its update depends on the split. Only the main process saves.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, gather_object
from peft import LoraConfig, PeftModel, get_peft_model
from peft.helpers import disable_input_dtype_casting
from transformers import AutoModelForCausalLM, set_seed

from sage.configs.schema import TrainConfig
from sage.engines.llm.models import bounded_heap, quiet_v6, resolve_dtype
from sage.engines.train import METRICS_FILE, OPTIMIZER_FILE
from sage.engines.train.attention import use_cpu_attention
from sage.engines.train.rows import TrainRow, check_rows
from sage.engines.train.trainer import build_trainer, corrected


def load_optimizer_state(adapter_dir: str | os.PathLike | None) -> dict | None:
    """The optimizer and scheduler state saved beside an adapter, or None (no adapter, or one saved without it)."""
    if not adapter_dir or not (Path(adapter_dir) / OPTIMIZER_FILE).is_file():
        return None
    return torch.load(Path(adapter_dir) / OPTIMIZER_FILE, map_location="cpu", weights_only=True)


def resolve_device(device: str | None) -> str:
    """`device` as given, else "cuda" when there is a GPU, else "cpu"."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def lora_config(cfg: TrainConfig) -> LoraConfig:
    """The adapter every iteration trains: LoRA on all linear layers (not the LM head), no modules_to_save, no
    DoRA (vLLM serves neither)."""
    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear", bias="none", task_type="CAUSAL_LM", use_dora=False,
                      modules_to_save=None)


def load_policy(model_path: str, adapter_in: str | None, cfg: TrainConfig, *, seed: int = 0, dtype: Any = None):
    """Base model + trainable LoRA: `adapter_in` if given, else a fresh adapter from `cfg` (seeded)."""
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


def train_step(model_path: str, adapter_in: str | None, adapter_out: str, rows: list[TrainRow], cfg: TrainConfig,
               *, seed: int = 0, device: str | None = None, dtype: str = "auto",
               on_step: Callable[[dict], None] | None = None, tracking: dict | None = None) -> dict:
    """Train the shared LoRA adapter once over `rows` (`train_model`) and save it to `adapter_out` atomically,
    replacing a directory there, with `METRICS_FILE` and `OPTIMIZER_FILE`; return the metrics plus total_seconds.

    The policy is `model_path` with its weights in `dtype` (`models.resolve_dtype`; LoRA stays float32) plus
    `adapter_in` and the optimizer state saved beside it, else a fresh LoRA from `cfg` seeded by `seed`. With no
    usable row the adapter is saved unchanged. Under `accelerate launch` every process calls this with the same
    rows. `tracking` names the run and folder of the trackers `cfg.report_to` lists (`trainer.build_trainer`)."""
    t_start = time.perf_counter()
    device = resolve_device(device)
    # Launched on CPUs, a process joins a gloo group only when its first PartialState is told the device is
    # the CPU; build it here so that also holds when no Trainer (which would say so too) is ever made.
    state = PartialState(cpu=device.startswith("cpu"))
    model = load_policy(model_path, adapter_in, cfg, seed=seed, dtype=resolve_dtype(dtype, device))
    carried = load_optimizer_state(adapter_in)
    metrics, full_state, opt_state = _train(model, model_path, rows, cfg, seed=seed, device=device,
                                            optimizer_state=carried, on_step=on_step, tracking=tracking)
    metrics["total_seconds"] = time.perf_counter() - t_start
    if state.is_main_process:
        _atomic_save(model, adapter_out, metrics, state_dict=full_state,
                     optimizer_state=opt_state if opt_state is not None else carried)
    state.wait_for_everyone()  # no process returns (and exits) before the adapter exists
    return metrics


def train_model(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int = 0,
                device: str | None = None, on_step: Callable[[dict], None] | None = None) -> dict:
    """Train an already loaded `PeftModel` in place, one pass over `rows` (see `train_step`); return metrics.
    `on_step` gets each optimizer update's `trainer.step_record` on the main process as the update ends.

    Metrics: loss, grad_norm, grad_norm_max, clip_fraction, entropy (over the updates, of what TRL logs; None
    when not logged), tokens (prompt + completion tokens of the rows used), completion_tokens, n_rows (used),
    n_skipped (empty completions), n_updates, optimizer_steps (AdamW's, all iterations so far), seconds and
    cpu_seconds (the training loop's), tokens_per_s, adv_mean_by_role, corrected_rows (rows the importance
    correction weighs: stored sampling log-probs, sampled without a grammar; 0 with `train.importance_correction`
    off), importance_ratio_mean, importance_ratio_min and importance_capped_fraction (over the updates: the mean
    of the means, the least weight, the mean capped fraction; None when no token was corrected), old_logps_seconds
    (spent scoring pi_old before the first update, 0 when the pass makes one update; see `trainer`), old_policy
    (where pi_old came from: sampler, the stored log-probs, or recompute; `train.old_policy`),
    temperatures ({role: temperature}), device, dtype, lr,
    loss_type, loss_weighting, seed, num_processes, distributed (accelerate's name: NO, MULTI_GPU, MULTI_CPU,
    FSDP, DEEPSPEED), rows_by_rank (per process, the indices into `rows` it trained on, in order), steps (TRL's
    per-update logs)."""
    return _train(model, tokenizer_path, rows, cfg, seed=seed, device=device, on_step=on_step)[0]


def _optimizer_state(trainer) -> dict | None:
    """The trainer's optimizer and scheduler state on the CPU; None when the optimizer is sharded over
    processes (FSDP, DeepSpeed), whose state this module does not gather."""
    if trainer.accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return None

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
    acc = trainer.accelerator
    zero3 = (acc.distributed_type == DistributedType.DEEPSPEED
             and getattr(acc.state.deepspeed_plugin, "zero_stage", None) == 3)
    if acc.distributed_type == DistributedType.FSDP or zero3:
        return acc.get_state_dict(trainer.model_wrapped)
    return None


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _run(trainer) -> tuple[float, float]:
    """`trainer.train()` with the CPU-minded settings for its length; (wall, process CPU) seconds. Under a bf16
    base the float32 LoRA weights compute in bf16 (the trainer's autocast casts the small weights), so PEFT's
    cast of every LoRA input to float32, and autocast's cast back, is switched off; on a CPU the model attends
    through `attention.use_cpu_attention`, which takes a micro-batch's rows packed into one sequence."""
    t0, c0 = time.perf_counter(), time.process_time()
    with disable_input_dtype_casting(trainer.model, active=trainer.sage_compute_dtype is not None), \
            use_cpu_attention(trainer.model, active=trainer.accelerator.device.type == "cpu"):
        trainer.train()
    return time.perf_counter() - t0, time.process_time() - c0


def _train(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int, device: str | None,
           optimizer_state: dict | None = None, on_step: Callable[[dict], None] | None = None,
           tracking: dict | None = None) -> tuple[dict, dict | None, dict | None]:
    """`train_model`, plus the gathered state dict for saving when the weights are sharded (else None) and the
    optimizer and scheduler state after training (None when nothing trained or the optimizer is sharded)."""
    used_at = [i for i, r in enumerate(rows) if len(r.completion_ids) > 0]
    usable = [rows[i] for i in used_at]
    check_rows(usable)
    device = resolve_device(device)
    torch_dtype = model.get_base_model().dtype
    state = PartialState()
    advantages: dict[str, list[float]] = {}
    for r in usable:
        advantages.setdefault(r.role, []).append(float(r.advantage))
    metrics = {
        "n_rows": len(usable), "n_skipped": len(rows) - len(usable),
        "tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in usable),
        "completion_tokens": sum(len(r.completion_ids) for r in usable),
        "adv_mean_by_role": {role: sum(v) / len(v) for role, v in sorted(advantages.items())},
        "corrected_rows": sum(corrected(r) for r in usable) if cfg.importance_correction else 0,
        "old_policy": "recompute",
        "temperatures": {r.role: r.temperature for r in usable},
        "device": device, "dtype": str(torch_dtype).removeprefix("torch."),
        "lr": cfg.lr, "loss_type": cfg.loss_type, "seed": seed, "num_processes": state.num_processes,
        "distributed": state.distributed_type.value,
        "loss": None, "grad_norm": None, "grad_norm_max": None, "clip_fraction": None, "entropy": None,
        "importance_ratio_mean": None, "importance_ratio_min": None, "importance_capped_fraction": None,
        "old_logps_seconds": 0.0,
        "n_updates": 0, "seconds": 0.0, "cpu_seconds": 0.0, "tokens_per_s": 0.0, "steps": [],
        "rows_by_rank": [[] for _ in range(state.num_processes)],
    }
    if not usable:  # nothing to learn from: the adapter goes on unchanged
        return metrics, None, None
    if state.num_processes > 1 and cfg.loss_type == "bnpo":
        warnings.warn("train.loss_type bnpo divides by the tokens of each process's own micro-batch, so its update "
                      "changes with the number of processes; dapo, grpo and dr_grpo do not", stacklevel=2)
    with quiet_v6(), bounded_heap(None if cfg.mmap_threshold_kb is None else cfg.mmap_threshold_kb << 10):
        trainer, steps = build_trainer(model, tokenizer_path, usable, cfg, seed=seed, device=device,
                                       torch_dtype=torch_dtype, optimizer_state=optimizer_state, on_step=on_step,
                                       tracking=tracking)
        try:
            seconds, cpu_seconds = _run(trainer)
            # Collectives: every process reaches them, right after training.
            rows_by_rank = gather_object([[used_at[i] for i in trainer.sage_seen]])
            full_state = _sharded_state_dict(trainer)
            opt_state = _optimizer_state(trainer)
        finally:
            shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
    adam = opt_state["optimizer"]["state"] if opt_state else None
    metrics.update({
        "loss": _mean([s.get("loss") for s in steps]),
        "grad_norm": _mean([s.get("grad_norm") for s in steps]),
        "grad_norm_max": max((s["grad_norm"] for s in steps if s.get("grad_norm") is not None), default=None),
        "clip_fraction": _mean([s.get("clip_ratio/region_mean") for s in steps]),
        "entropy": _mean([s.get("entropy") for s in steps]),
        "importance_ratio_mean": _mean([s.get("importance/ratio_mean") for s in steps]),
        "importance_ratio_min": min((s["importance/ratio_min"] for s in steps
                                     if s.get("importance/ratio_min") is not None), default=None),
        "importance_capped_fraction": _mean([s.get("importance/capped_fraction") for s in steps]),
        "old_logps_seconds": trainer.sage_old_seconds,
        "old_policy": "sampler" if trainer.sage_sampler_old else "recompute",
        "corrected_rows": 0 if trainer.sage_importance_cap is None else metrics["corrected_rows"],
        "n_updates": trainer.state.global_step,
        "num_processes": trainer.accelerator.num_processes,
        "distributed": trainer.accelerator.distributed_type.value,
        "seconds": seconds, "cpu_seconds": cpu_seconds,
        "tokens_per_s": metrics["tokens"] / seconds if seconds > 0 else 0.0,
        "steps": steps, "rows_by_rank": rows_by_rank,
        "optimizer_steps": int(float(next(iter(adam.values()))["step"])) if adam else None,
        "loss_weighting": cfg.loss_weighting,
    })
    return metrics, full_state, opt_state
