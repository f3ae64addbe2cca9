"""`build_trainer`: the stored-rows trainer (`trl_trainer.StoredRowsTrainer`) configured for one pass over the rows:
TRL's `GRPOConfig` with one update per generation batch, a constant learning rate and no reward scaling, the
rows' indices as its dataset, and a callback that captures TRL's per-update logs (`updates.UpdateLog`).

Nothing here imports TRL, torch or transformers at module import; `build_trainer` does.
"""

from __future__ import annotations

import math
import tempfile
from typing import Callable

from sage.configs.schema import TrainConfig
from sage.engines.llm.models import adapter_compute_dtype
from sage.engines.train import prefix
from sage.engines.train.rows import TrainRow
from sage.engines.train.trl_trainer import trainer_class
from sage.engines.train.updates import UpdateLog, block_tokens


def _num_generations(generation_batch: int) -> int:
    """Smallest divisor >= 2 of the generation batch (TRL requires one; nothing here uses it)."""
    for g in range(2, generation_batch + 1):
        if generation_batch % g == 0:
            return g
    return 2


def _unused_reward(prompts=None, completions=None, **kwargs):
    """TRL requires a reward function; stored rows are already scored, so this is never called."""
    raise RuntimeError("StoredRowsTrainer never scores completions")


def build_trainer(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int, device: str,
                   torch_dtype, optimizer_state: dict | None = None, on_step: Callable[[dict], None] | None = None):
    """A `StoredRowsTrainer` for one pass over `rows` (all with a non-empty completion), and the list it fills
    with TRL's per-update logs as `train()` runs. `optimizer_state` ({"optimizer", "scheduler"} state dicts of
    the previous iteration's trainer) is loaded into the new optimizer and scheduler, so AdamW's moments and
    step count carry over. `on_step`, called on the main process as each update ends, gets that update's
    `updates.step_record`. The caller removes `trainer.args.output_dir` afterwards."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig

    cls = trainer_class()
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
        temperature=1.0,  # each row's own temperature is applied by `_get_per_token_logps_and_entropies`
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
        ddp_find_unused_parameters=False,  # every LoRA weight is used in every pass: DDP need not search
        dataloader_num_workers=0,
        log_completions=False,
    )
    args.max_steps = math.ceil(len(rows) / args.generation_batch_size)  # one update per generation batch

    log = UpdateLog(on_step)
    dataset = Dataset.from_dict({"row": list(range(len(rows))) + [-1]})
    trainer = cls(model=model, reward_funcs=_unused_reward, args=args, train_dataset=dataset,
                  processing_class=tokenizer, rows=rows, callbacks=[log.callback()],
                  role_mean=cfg.loss_weighting == "role_mean", optimizer_state=optimizer_state,
                  compute_dtype=adapter_compute_dtype(torch_dtype), share_prefix=prefix.usable(cfg),
                  by_prompt=cfg.update_order == "by_prompt")
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    log.block_tokens += block_tokens(trainer, rows)
    return trainer, log.steps
