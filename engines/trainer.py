"""One TRR++ policy-gradient step on the shared LoRA adapter, through TRL's `GRPOTrainer`, on stored rows.

SAGE scores and normalises advantages itself (TRR++: per role), so TRL must neither generate nor score nor
re-normalise anything. `StoredRowsTrainer` (a small `GRPOTrainer` subclass, built lazily because
`from trl import GRPOTrainer` takes seconds) overrides two private methods:

- `_generate_and_score_completions(inputs)` builds the batch from the stored rows: left-padded prompt ids,
  right-padded completion ids, their masks, the stored advantage (one per row), `num_items_in_batch` (completion
  tokens in the generation batch, gathered over processes), the stored sampling log-probs as
  `old_per_token_logps` when every row of the batch has them, and `ref_per_token_logps` when `beta != 0`.
  Without stored log-probs (or with only some rows having them) TRL uses the current policy's detached
  log-probs: ratio 1, the plain on-policy gradient -A * grad log pi, for every update of the pass.
- `_get_train_sampler()` replaces TRL's `RepeatSampler` (which repeats each prompt `num_generations` times) by a
  plain sampler over the rows: a seeded permutation (or the given order), cut into blocks of one generation batch
  (`minibatch_size * grad_accum * processes` rows). Each block is yielded `grad_accum` times in a row, because
  TRL's `_prepare_inputs` turns the first copy into the batch and slices it into `grad_accum` micro-batches for
  the following micro-steps (it never reads the later copies). A short last block is padded with a dummy row
  index, and `_generate_and_score_completions` turns those into fully masked rows (no loss, no gradient).

Semantics of one `train_step`: one pass over all rows with a non-empty completion; one optimizer update per
block of `cfg.minibatch_size * cfg.grad_accum` rows (per process), i.e. `ceil(n_rows / (minibatch_size *
grad_accum * processes))` updates; constant learning rate, AdamW, fresh optimizer state every step (the adapter
is the only state carried from one iteration to the next). With the default `dapo` loss the update is the
token-level mean of the clipped policy-gradient loss over all completion tokens of the block.

`python -m engines.trainer --in rows.parquet --out ADAPTER --model PATH --config JSON` runs the same step in its
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

from configs.schema import TrainConfig

#: File written next to the adapter weights, with the metrics of the step that produced them.
METRICS_FILE = "sage_train_metrics.json"

#: Keys `_generate_and_score_completions` returns (the optional ones only when they apply).
BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")
OPTIONAL_BATCH_KEYS = ("old_per_token_logps", "ref_per_token_logps")


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


def _num_generations(generation_batch: int) -> int:
    """Smallest divisor >= 2 of the generation batch (TRL requires one; nothing here uses it)."""
    for g in range(2, generation_batch + 1):
        if generation_batch % g == 0:
            return g
    return 2


def _usable(rows: list[TrainRow]) -> list[TrainRow]:
    return [r for r in rows if len(r.completion_ids) > 0]


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


# --------------------------------------------------------------------------------------------------------------
# The sampler and the trainer subclass


def _block_sampler_class():
    from torch.utils.data import Sampler

    class BlockRepeatSampler(Sampler):
        """Rows in a seeded random (or the given) order, in blocks of `block` indices, each block `repeats` times.

        A short last block is filled with `dummy` (an index whose row the trainer masks out entirely).
        """

        def __init__(self, n_rows: int, block: int, repeats: int, dummy: int, shuffle: bool, seed: int):
            self.n_rows, self.block, self.repeats, self.dummy = n_rows, block, repeats, dummy
            self.shuffle, self.seed = shuffle, seed

        def __iter__(self):
            import torch

            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed)
                order = torch.randperm(self.n_rows, generator=g).tolist()
            else:
                order = list(range(self.n_rows))
            for start in range(0, self.n_rows, self.block):
                chunk = order[start:start + self.block]
                chunk += [self.dummy] * (self.block - len(chunk))
                for _ in range(self.repeats):
                    yield from chunk

        def __len__(self) -> int:
            return math.ceil(self.n_rows / self.block) * self.block * self.repeats

    return BlockRepeatSampler


_TRAINER_CLASS = None


def _trainer_class():
    """Build (once) the `GRPOTrainer` subclass; importing TRL takes seconds, so it happens only here."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    import torch
    from trl import GRPOTrainer
    from trl.trainer.utils import use_adapter

    sampler_cls = _block_sampler_class()

    class StoredRowsTrainer(GRPOTrainer):
        """`GRPOTrainer` fed stored rollouts: no generation, no reward functions, no advantage normalisation.

        The train dataset holds one column, `row` (an index into `rows`; -1 is the dummy padding row).
        """

        def __init__(self, *args, rows: list[TrainRow], **kwargs):
            self.sage_rows = list(rows)
            super().__init__(*args, **kwargs)

        # -- data ------------------------------------------------------------------------------------------
        def _get_train_sampler(self, dataset=None):
            n = len(self.sage_rows)
            return sampler_cls(n_rows=n, block=self.args.generation_batch_size,
                               repeats=self.args.steps_per_generation * self.num_iterations,
                               dummy=n, shuffle=bool(self.shuffle_dataset), seed=self.args.seed)

        def _generate_and_score_completions(self, inputs):
            device = self.accelerator.device
            spg = self.args.steps_per_generation
            real = [self.sage_rows[int(x["row"])] for x in inputs if int(x["row"]) >= 0]
            # Micro-batches must have equal size: pad the real rows to a multiple of steps_per_generation.
            size = max(spg, math.ceil(len(real) / spg) * spg)
            rows: list[TrainRow | None] = real + [None] * (size - len(real))
            pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
            p_len = max([len(r.prompt_ids) for r in real] + [1])
            c_len = max([len(r.completion_ids) for r in real] + [1])
            prompt_ids = torch.full((size, p_len), pad, dtype=torch.long)
            prompt_mask = torch.zeros((size, p_len), dtype=torch.long)
            completion_ids = torch.full((size, c_len), pad, dtype=torch.long)
            completion_mask = torch.zeros((size, c_len), dtype=torch.long)
            advantages = torch.zeros(size, dtype=torch.float32)
            with_logps = bool(real) and all(r.logprobs is not None for r in real)
            old = torch.zeros((size, c_len), dtype=torch.float32) if with_logps else None
            for i, r in enumerate(rows):
                if r is None:  # dummy: one attended prompt token (no fully masked sequence), no completion
                    prompt_mask[i, -1] = 1
                    continue
                p, c = len(r.prompt_ids), len(r.completion_ids)
                prompt_ids[i, p_len - p:] = torch.tensor(r.prompt_ids, dtype=torch.long)
                prompt_mask[i, p_len - p:] = 1
                completion_ids[i, :c] = torch.tensor(r.completion_ids, dtype=torch.long)
                completion_mask[i, :c] = 1
                advantages[i] = float(r.advantage)
                if old is not None:
                    old[i, :c] = torch.tensor(r.logprobs, dtype=torch.float32)
            prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
            completion_ids, completion_mask = completion_ids.to(device), completion_mask.to(device)
            num_items_in_batch = self.accelerator.gather(completion_mask.sum()).sum()
            output = {
                "prompt_ids": prompt_ids,
                "prompt_mask": prompt_mask,
                "completion_ids": completion_ids,
                "completion_mask": completion_mask,
                "advantages": advantages.to(device),
                "num_items_in_batch": num_items_in_batch,
            }
            if old is not None:
                output["old_per_token_logps"] = old.to(device)
            if self.beta != 0.0:
                input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
                attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
                with torch.no_grad():
                    if self.ref_model is not None:
                        ref, _, _ = self._get_per_token_logps_and_entropies(
                            self.ref_model, input_ids, attention_mask, c_len,
                            batch_size=self.args.per_device_train_batch_size)
                    else:
                        # New adapter: adapters disabled is the base model; retrained adapter: TRL's "ref" copy.
                        model = self.accelerator.unwrap_model(self.model)
                        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                            ref, _, _ = self._get_per_token_logps_and_entropies(
                                self.model, input_ids, attention_mask, c_len,
                                batch_size=self.args.per_device_train_batch_size)
                output["ref_per_token_logps"] = ref
            return output

        # -- loss ------------------------------------------------------------------------------------------
        def _compute_loss(self, model, inputs):
            # A micro-batch keeps the padding of its whole generation batch; drop the columns it does not use.
            pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
            p_used = pm.any(dim=0).nonzero()
            p0 = int(p_used[0]) if len(p_used) else pm.size(1) - 1
            c_used = cm.any(dim=0).nonzero()
            c1 = int(c_used[-1]) + 1 if len(c_used) else 1
            if p0 > 0 or c1 < cm.size(1):
                inputs = dict(inputs)
                inputs["prompt_ids"] = inputs["prompt_ids"][:, p0:]
                inputs["prompt_mask"] = pm[:, p0:]
                for key in ("completion_ids", "completion_mask", "old_per_token_logps", "ref_per_token_logps",
                            "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask"):
                    value = inputs.get(key)
                    if isinstance(value, torch.Tensor) and value.dim() == 2:
                        inputs[key] = value[:, :c1]
            return super()._compute_loss(model, inputs)

    _TRAINER_CLASS = StoredRowsTrainer
    return StoredRowsTrainer


def __getattr__(name: str):  # `engines.trainer.StoredRowsTrainer` without importing TRL at module import
    if name == "StoredRowsTrainer":
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unused_reward(prompts=None, completions=None, **kwargs):
    """TRL requires a reward function; stored rows are already scored, so this is never called."""
    raise RuntimeError("StoredRowsTrainer never scores completions")


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
    """`auto`: bfloat16 on a CUDA device that supports it, else float32."""
    import torch

    if dtype == "auto":
        if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
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


def _atomic_save(model, adapter_out: str | os.PathLike, metrics: dict) -> Path:
    out = Path(adapter_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, selected_adapters=["default"])
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

    Returns the metrics of `train_model`, plus total_seconds (with loading and saving).
    """
    t_start = time.perf_counter()
    from accelerate import PartialState

    device = resolve_device(device)
    model = load_policy(model_path, adapter_in, cfg, seed=seed, dtype=resolve_dtype(dtype, device))
    metrics = train_model(model, model_path, rows, cfg, seed=seed, device=device, temperature=temperature)
    metrics["total_seconds"] = time.perf_counter() - t_start
    state = PartialState()
    if state.is_main_process:
        _atomic_save(model, adapter_out, metrics)
    state.wait_for_everyone()
    return metrics


def train_model(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int = 0,
                device: str | None = None, temperature: float = 1.0) -> dict:
    """Train an already loaded `PeftModel` in place, one pass over `rows` (see `train_step`); return metrics.

    Metrics: loss, grad_norm, grad_norm_max, clip_fraction, entropy (means over updates of what TRL logs; None
    when not logged), tokens (prompt + completion tokens of the rows used), completion_tokens, n_rows (used),
    n_skipped (empty completions), n_updates, seconds (the training loop only, wall clock), cpu_seconds (its
    process CPU time, all threads), tokens_per_s (tokens / seconds),
    adv_mean_by_role ({role: mean advantage}), used_logprobs (every row had stored log-probs), device, dtype,
    lr, loss_type, seed, steps (TRL's per-update logs).
    """
    usable = _usable(rows)
    _check_rows(usable)
    device = resolve_device(device)
    torch_dtype = model.get_base_model().dtype
    metrics = {
        "n_rows": len(usable), "n_skipped": len(rows) - len(usable),
        "tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in usable),
        "completion_tokens": sum(len(r.completion_ids) for r in usable),
        "adv_mean_by_role": _role_means(usable),
        "used_logprobs": bool(usable) and all(r.logprobs is not None for r in usable),
        "device": device, "dtype": str(torch_dtype).removeprefix("torch."),
        "lr": cfg.lr, "loss_type": cfg.loss_type, "seed": seed,
        "loss": None, "grad_norm": None, "grad_norm_max": None, "clip_fraction": None, "entropy": None,
        "n_updates": 0, "seconds": 0.0, "cpu_seconds": 0.0, "tokens_per_s": 0.0, "steps": [],
    }
    if not usable:  # nothing to learn from: the adapter goes on unchanged
        return metrics
    with _quiet_v6():
        trainer, steps = _build_trainer(model, tokenizer_path, usable, cfg, seed=seed, device=device,
                                        torch_dtype=torch_dtype, temperature=temperature)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            trainer.train()
            seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        finally:
            shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
    metrics.update({
        "loss": _mean([s.get("loss") for s in steps]),
        "grad_norm": _mean([s.get("grad_norm") for s in steps]),
        "grad_norm_max": max((s["grad_norm"] for s in steps if s.get("grad_norm") is not None), default=None),
        "clip_fraction": _mean([s.get("clip_ratio/region_mean") for s in steps]),
        "entropy": _mean([s.get("entropy") for s in steps]),
        "n_updates": trainer.state.global_step,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "tokens_per_s": metrics["tokens"] / seconds if seconds > 0 else 0.0,
        "steps": steps,
    })
    return metrics


def _build_trainer(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int, device: str,
                   torch_dtype, temperature: float):
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig

    cls = _trainer_class()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    bs, ga = cfg.minibatch_size, cfg.grad_accum
    if bs * ga == 1:  # TRL needs num_generations >= 2 dividing the generation batch
        bs = 2
    workdir = tempfile.mkdtemp(prefix="sage-trl-")
    args = GRPOConfig(
        output_dir=workdir,
        per_device_train_batch_size=bs,
        gradient_accumulation_steps=ga,
        steps_per_generation=ga,
        num_generations=_num_generations(bs * ga),
        num_iterations=1,
        max_steps=1,  # set below, once the number of processes is known
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",
        max_grad_norm=cfg.max_grad_norm,
        epsilon=cfg.clip_eps_low,
        epsilon_high=cfg.clip_eps_high,
        beta=cfg.kl_beta,
        loss_type=cfg.loss_type,
        scale_rewards="none",
        max_completion_length=max(len(r.completion_ids) for r in rows),  # dr_grpo's constant normaliser
        temperature=temperature,
        gradient_checkpointing=cfg.gradient_checkpointing,
        bf16=torch_dtype == torch.bfloat16 and not device.startswith("cpu"),
        use_cpu=device.startswith("cpu"),
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        logging_strategy="steps",
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        shuffle_dataset=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        log_completions=False,
    )
    args.max_steps = math.ceil(len(rows) / args.generation_batch_size)  # one update per generation batch

    steps: list[dict] = []

    class _Capture(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                steps.append({k: (float(v) if isinstance(v, (int, float)) else v) for k, v in logs.items()})

    dataset = Dataset.from_dict({"row": list(range(len(rows))) + [-1]})
    trainer = cls(model=model, reward_funcs=_unused_reward, args=args, train_dataset=dataset,
                  processing_class=tokenizer, rows=rows, callbacks=[_Capture()])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer, steps


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
    """Write rows in the format `read_rows` (and `python -m engines.trainer --in`) reads."""
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
    """`python -m engines.trainer --in rows.parquet --out ADAPTER --model PATH --config JSON [--metrics FILE]`."""
    ap = argparse.ArgumentParser(prog="python -m engines.trainer", description=__doc__.split("\n\n")[0])
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
    metrics = train_step(a.model, a.adapter_in, a.out, read_rows(a.rows), _load_config(a.config), seed=a.seed,
                         device=a.device, dtype=a.dtype, temperature=a.temperature)
    if a.metrics and int(os.environ.get("RANK", "0")) == 0:
        path = Path(a.metrics)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True))
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(train_main(sys.argv[1:]))
