"""The TRL side of a training step: `StoredRowsTrainer`, a `GRPOTrainer` subclass fed stored rows in the order of
`BlockRepeatSampler`, and `build_trainer`, which configures it for one pass over the rows and captures TRL's
per-update logs (`UpdateLog`).

SAGE scores and normalises advantages itself (TRR++: per role), so TRL must neither generate nor score nor
re-normalise anything. TRL is pinned to 1.16; `tests/engines/train/test_trainer.py` checks the shapes of the
private methods below. The overrides, each with its reason:

- `_get_train_sampler`: TRL's `RepeatSampler` repeats each prompt `num_generations` times and drops a short last
  block; stored rows are each trained once, in the blocks `update_blocks` lays out (`BlockRepeatSampler`).
- `_generate_and_score_completions`: the batch comes from the stored rows, not from generation (`stored_batch`).
  Each row's state is a key of the batch, so each micro-batch carries its own rows' values: the stored advantage
  scaled per role (`role_share` over the pass, `role_mean` per update), the row's sampling temperature
  (`temperatures`), the stored sampling log-probs (`sampling_per_token_logps`) with the rows they correct
  (`corrected`), and pi_old (`old_per_token_logps`) when the pass makes several updates. Dummy rows become fully
  masked rows, so every process has a batch of the same shape.
- `_prepare_inputs`: TRL's, except that it cuts the generation batch into micro-batches by length instead of at
  random: longest first, so rows of similar length share a padded pass; where passes pack their rows (the CPU
  attention), dealt in snake order (`dealt`), so the largest pass, which sets the peak memory, is not the
  update's longest rows together. Which rows make an update stays the sampler's choice.
- `_get_per_token_logps_and_entropies`: scores through `logprobs.completion_logprobs`, each row at its own
  sampling temperature (TRL's is one number, kept at 1.0), only the completion tokens that exist, the entropy
  only when asked for; under bf16 autocast where the base is bf16.
- `_compute_loss`: drops the padding columns the micro-batch does not use and calls TRL's, scoring the micro-batch
  at its rows' temperatures (TRL's call has no place for them) and, with the importance correction on, weighing
  its advantages per token by `importance_weights` between that forward pass and TRL's loss, which reads them.
- `log` (public hook): adds the importance weights' statistics of the update to TRL's logged metrics.
- `create_optimizer`, `create_scheduler` (public hooks): load AdamW's and the scheduler's state carried from the
  previous iteration's adapter, so the optimisation continues across iterations.

pi_old is the trainer's own log-probs of the policy as the pass starts (`train.old_policy` recompute) or the
stored sampling log-probs (sampler); the stored log-probs otherwise only weigh tokens, capped, and only for rows
sampled without a grammar. docs/decisions.md ("The old policy and the importance correction") says why.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Callable

import torch
from datasets import Dataset
from torch.utils.data import Sampler
from transformers import AutoTokenizer, TrainerCallback
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import split_tensor_dict, use_adapter

from sage.configs.schema import TrainConfig
from sage.engines.llm.models import adapter_compute_dtype
from sage.engines.train.attention import packs
from sage.engines.train.logprobs import add_completion_head, completion_logprobs
from sage.engines.train.rows import TrainRow, pass_role_weights, role_shares, role_weights

#: The importance statistics `StoredRowsTrainer.log` adds to TRL's logs of an update -> `step_record`'s names.
IMPORTANCE_LOGS = {"importance/ratio_mean": "importance_ratio_mean", "importance/ratio_min": "importance_ratio_min",
                   "importance/capped_fraction": "importance_capped_fraction"}


def update_blocks(n_rows: int, block: int, shuffle: bool, seed: int) -> list[list[int | None]]:
    """How the rows of a pass fall into its updates, the one place that says so: a seeded random permutation of the
    row indices (or their order) cut into blocks of `block` rows, one generation batch each (one update:
    `minibatch_size * grad_accum * processes` rows), a short last block padded with None (a dummy row, which the
    trainer masks out). Under `accelerate launch` process k trains on the k-th of the equal contiguous slices of
    each block (`StoredRowsTrainer._process_rows`), as accelerate deals the sampler's batches."""
    order = list(range(n_rows))
    if shuffle:
        order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[start:start + block] + [None] * (start + block - n_rows) for start in range(0, n_rows, block)]


class BlockRepeatSampler(Sampler):
    """The row indices of `update_blocks`, each block `repeats` times in a row (as TRL's `_prepare_inputs` expects),
    a dummy as `dummy` (an index whose row the trainer masks out entirely)."""

    def __init__(self, n_rows: int, block: int, repeats: int, dummy: int, shuffle: bool, seed: int):
        self.blocks = [[dummy if i is None else i for i in b] for b in update_blocks(n_rows, block, shuffle, seed)]
        self.repeats = repeats

    def __iter__(self):
        for chunk in self.blocks:
            for _ in range(self.repeats):
                yield from chunk

    def __len__(self) -> int:
        return sum(map(len, self.blocks)) * self.repeats


def reordered(batch: dict, order: torch.Tensor) -> dict:
    """A generation batch (its tensors one row per row) with its rows in `order`; the entries that are not one
    per row (`num_items_in_batch`) as they are."""
    rows = len(order)
    return {k: v[order.to(v.device)] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.size(0) == rows else v
            for k, v in batch.items()}


def longest_first(batch: dict) -> dict:
    """A generation batch with its rows ordered by real tokens (prompt + completion), longest first; ties keep
    their order."""
    lengths = batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)
    return reordered(batch, torch.sort(lengths, descending=True, stable=True).indices)


def dealt(batch: dict, parts: int) -> dict:
    """A generation batch ordered longest first, its rows dealt to `parts` equal contiguous micro-batches in snake
    order (1, 2, .., parts, parts, .., 2, 1, ...), so that each micro-batch carries about the same tokens (as it
    is, when `parts` is 1 or does not divide the rows)."""
    rows = batch["prompt_mask"].size(0)
    if parts <= 1 or rows % parts:
        return batch
    slots: list[list[int]] = [[] for _ in range(parts)]
    for position in range(rows):
        lap, i = divmod(position, parts)
        slots[i if lap % 2 == 0 else parts - 1 - i].append(position)
    return reordered(batch, torch.tensor([p for s in slots for p in s]))


def corrected(row: TrainRow | None) -> bool:
    """Whether the importance correction weighs `row`'s tokens: it stored its sampling log-probs and was sampled
    without a grammar (docs/decisions.md says why a constrained row weighs 1)."""
    return row is not None and row.logprobs is not None and not row.constrained


def importance_weights(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                       cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token importance weights min(exp(old - sampling), cap) where `mask` is set, 1 elsewhere, and where
    the cap truncated them (TRL's token_truncate correction). A token whose difference is not a number weighs 1,
    as in TRL."""
    on = mask.bool()
    diff = torch.nan_to_num(torch.where(on, old_logps - sampling_logps, torch.zeros_like(old_logps)), nan=0.0)
    ratio = torch.exp(diff)
    return ratio.clamp(max=cap), on & (ratio > cap)


def stored_batch(rows: list[TrainRow | None], pad: int, weights: list[float] | None, correct: bool,
                 sampler_old: bool = False) -> dict:
    """The tensors (on the CPU) of a generation batch of stored rows in TRL's layout: left-padded prompts,
    right-padded completions, advantages (times `weights` when given), temperatures, and when `correct` the stored
    log-probs as `sampling_per_token_logps` (zeros for a row without) with `corrected` (1.0 for each row
    `corrected` says the importance correction weighs, else 0.0); when `sampler_old` the stored log-probs as
    `old_per_token_logps` (pi_old; zeros for a dummy). A None row is a dummy: one attended prompt token, no
    completion."""
    real = [r for r in rows if r is not None]
    size = len(rows)
    p_len = max([len(r.prompt_ids) for r in real] + [1])
    c_len = max([len(r.completion_ids) for r in real] + [1])
    out = {"prompt_ids": torch.full((size, p_len), pad, dtype=torch.long),
           "prompt_mask": torch.zeros((size, p_len), dtype=torch.long),
           "completion_ids": torch.full((size, c_len), pad, dtype=torch.long),
           "completion_mask": torch.zeros((size, c_len), dtype=torch.long),
           "advantages": torch.zeros(size, dtype=torch.float32),
           "temperatures": torch.ones(size, dtype=torch.float32)}
    if correct:
        out["sampling_per_token_logps"] = torch.zeros((size, c_len), dtype=torch.float32)
        out["corrected"] = torch.tensor([float(corrected(r)) for r in rows], dtype=torch.float32)
    if sampler_old:
        out["old_per_token_logps"] = torch.zeros((size, c_len), dtype=torch.float32)
    for i, r in enumerate(rows):
        if r is None:  # no fully masked sequence: attention needs one key per row
            out["prompt_mask"][i, -1] = 1
            continue
        p, c = len(r.prompt_ids), len(r.completion_ids)
        out["prompt_ids"][i, p_len - p:] = torch.tensor(r.prompt_ids, dtype=torch.long)
        out["prompt_mask"][i, p_len - p:] = 1
        out["completion_ids"][i, :c] = torch.tensor(r.completion_ids, dtype=torch.long)
        out["completion_mask"][i, :c] = 1
        out["advantages"][i] = float(r.advantage) * weights[i] if weights is not None else float(r.advantage)
        out["temperatures"][i] = float(r.temperature)
        if correct and r.logprobs is not None:
            out["sampling_per_token_logps"][i, :c] = torch.tensor(r.logprobs, dtype=torch.float32)
        if sampler_old and r.logprobs is not None:
            out["old_per_token_logps"][i, :c] = torch.tensor(r.logprobs, dtype=torch.float32)
    return out


def step_record(logs: dict, step: int, updates: int, tokens: int | None, seconds: float) -> dict:
    """One optimizer update as the train stage reports it (the display, the adapter's metrics file; `train_steps`
    stores `TRAIN_STEP_COLUMNS` of it): `step` of `updates` in this pass, TRL's logged loss, grad norm, entropy,
    clip fraction (`clip_ratio/region_mean`) and learning rate, the importance weights' mean and minimum over the
    update's corrected tokens and the fraction the cap truncated (`IMPORTANCE_LOGS`; None when no token was
    corrected), the tokens of the update's rows, and the wall-clock seconds since the previous update ended."""
    def number(key):
        value = logs.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    return {"step": step, "updates": updates, "loss": number("loss"), "grad_norm": number("grad_norm"),
            "entropy": number("entropy"), "clip_fraction": number("clip_ratio/region_mean"),
            "learning_rate": number("learning_rate"),
            **{name: number(key) for key, name in IMPORTANCE_LOGS.items()},
            "tokens": tokens, "seconds": seconds}


class UpdateLog(TrainerCallback):
    """Keeps TRL's per-update logs of one pass (`steps`) and hands each update's `step_record` to `on_step` on the
    main process as the update ends. TRL does not log tokens: `block_tokens` (each update's tokens, from the
    trainer's seeded sampler) is filled once the trainer exists."""

    def __init__(self, on_step: Callable[[dict], None] | None = None):
        self.steps: list[dict] = []
        self.block_tokens: list[int] = []
        self.on_step = on_step
        self._last = time.perf_counter()  # when the previous update (or training) ended

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        self.steps.append({k: (float(v) if isinstance(v, (int, float)) else v) for k, v in logs.items()})
        now = time.perf_counter()
        if self.on_step is not None and state.is_world_process_zero:
            k = state.global_step
            tokens = self.block_tokens[k - 1] if k <= len(self.block_tokens) else None
            self.on_step(step_record(logs, k, state.max_steps, tokens, now - self._last))
        self._last = now


class RunTensorBoard(TensorBoardCallback):
    """transformers' TensorBoard callback writing one run's curve: its event files in `logging_dir` (the run's folder,
    not the trainer's removed output directory) and each update at the run's global step, `offset` (the updates of
    the run's earlier iterations) + the pass's own, as `training_curve.global_step` counts them."""

    def __init__(self, logging_dir: str | None, offset: int = 0):
        super().__init__()
        self.offset = offset
        if logging_dir is not None:  # read when training begins
            self.logging_dir = logging_dir

    def on_log(self, args, state, control, logs=None, **kwargs):
        shifted = dataclasses.replace(state, global_step=state.global_step + self.offset)
        super().on_log(args, shifted, control, logs=logs, **kwargs)


class StoredRowsTrainer(GRPOTrainer):
    """`GRPOTrainer` fed stored rollouts: no generation, no reward functions, no advantage normalisation (see the
    module docstring). The model is a `PeftModel`; the train dataset holds one column, `row`: an index into
    `rows`, -1 for the dummy row."""

    def __init__(self, *args, rows: list[TrainRow], weighting: str = "token_mean",
                 shares: dict[str, float] | None = None, optimizer_state: dict | None = None,
                 compute_dtype=None, importance_cap: float | None = None, sampler_old: bool = False, **kwargs):
        self.sage_rows = list(rows)
        self.sage_compute_dtype = compute_dtype  # bf16 base + float32 LoRA: the adapter computes in bf16 too
        self.sage_weighting = weighting  # train.loss_weighting
        # Each role's completion tokens in the whole pass (its roles sorted) and, for role_share, its share of it:
        # every process reads every row, so these agree across processes.
        self.sage_pass_tokens = {role: float(sum(len(r.completion_ids) for r in rows if r.role == role))
                                 for role in sorted({r.role for r in rows})}
        self.sage_shares = role_shares(self.sage_pass_tokens, shares)
        self.sage_optimizer_state = optimizer_state  # {"optimizer": ..., "scheduler": ...} carried in
        self.sage_seen: list[int] = []  # indices into `rows` this process trained on, in order
        # The importance correction's cap, None when off. The backends store log-probs at the row's sampling
        # temperature, the one it trains at; each row is corrected or not on its own (`corrected`), so no
        # choice depends on how the rows are split over processes.
        self.sage_importance_cap = importance_cap
        # pi_old from the stored sampling log-probs (`train.old_policy` sampler, every row has them): nothing to
        # recompute, and the importance weight would be exp(mu - mu) = 1
        self.sage_sampler_old = sampler_old and all(r.logprobs is not None for r in rows)
        if self.sage_sampler_old:
            self.sage_importance_cap = None
        self.sage_old: dict[int, torch.Tensor] | None = None  # row index -> pi_old, when the pass recomputes it
        self.sage_old_seconds = 0.0  # spent computing `sage_old`
        # the update's importance statistics so far, over all processes: corrected tokens, weight sum, capped, min
        self.sage_importance = [0.0, 0.0, 0.0, math.inf]
        self.sage_scoring: dict | None = None  # the micro-batch TRL's loss is scoring (`_compute_loss`)
        super().__init__(*args, **kwargs)
        if self.aux_loss_enabled:
            raise ValueError("the stored-rows trainer does not add a mixture-of-experts router loss; train a "
                             "dense model or set the model's router_aux_loss_coef to 0")
        add_completion_head(self.model.get_base_model())

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if self.sage_optimizer_state is not None:
            optimizer.load_state_dict(self.sage_optimizer_state["optimizer"])
        return optimizer

    def create_scheduler(self, num_training_steps, optimizer=None):
        fresh = self.lr_scheduler is None
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if fresh and self.sage_optimizer_state is not None and self.sage_optimizer_state.get("scheduler"):
            scheduler.load_state_dict(self.sage_optimizer_state["scheduler"])
        return scheduler

    def _get_train_sampler(self, dataset=None):
        n = len(self.sage_rows)
        return BlockRepeatSampler(n, self.args.generation_batch_size, self.args.steps_per_generation *
                                  self.num_iterations, dummy=n, shuffle=bool(self.shuffle_dataset), seed=self.args.seed)

    def _update_blocks(self) -> list[list[int | None]]:
        """The pass's `update_blocks`, as this trainer's sampler yields them."""
        return update_blocks(len(self.sage_rows), self.args.generation_batch_size, bool(self.shuffle_dataset),
                             self.args.seed)

    def _prepare_inputs(self, generation_batch):
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        spg = self.args.steps_per_generation
        if self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None:
            batch = longest_first(self._generate_and_score_completions(generation_batch))
            if packs(self.model):  # packed passes: the same tokens each, not the longest rows together
                batch = dealt(batch, spg)
            self._buffered_inputs = split_tensor_dict(batch, spg)
        return self._buffered_inputs[self._step % spg]

    def _generate_and_score_completions(self, inputs):
        device = self.accelerator.device
        spg = self.args.steps_per_generation
        indices = [int(x["row"]) for x in inputs]
        self.sage_seen.extend(i for i in indices if i >= 0)
        # Dummy rows stay in the batch as masked rows, so every process has a batch of the same shape (TRL
        # gathers per-row metrics across processes) and the per-sequence losses (grpo, dr_grpo) divide by
        # the same row count whether the block is split over processes or not.
        size = math.ceil(len(indices) / spg) * spg
        rows: list[TrainRow | None] = [self.sage_rows[i] if i >= 0 else None for i in indices]
        rows += [None] * (size - len(rows))
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        weights = self._role_weights(rows) if self.sage_weighting != "token_mean" else None
        batch = stored_batch(rows, pad, weights, self.sage_importance_cap is not None, self.sage_sampler_old)
        if self.args.max_steps > 1 and not self.sage_sampler_old:  # several updates: pi_old is the policy before
            # the first (`_old_logps`, scored as the first update's batch is built); the first update's own rows
            # take the detached log-probs of their own pass, the same policy
            if self.sage_old is None:
                self.sage_old = self._old_logps()
        if self.sage_old is not None and self.state.global_step > 0:
            old = torch.zeros_like(batch["completion_mask"], dtype=torch.float32)
            for i, r in enumerate(indices):
                if r >= 0:
                    if r not in self.sage_old:
                        raise RuntimeError(f"row {r} reached process {self.accelerator.process_index}, which did not "
                                           "score its pi_old: the sampler's blocks are dealt differently than "
                                           "`_process_rows` assumes")
                    old[i, :len(self.sage_old[r])] = self.sage_old[r]
            batch["old_per_token_logps"] = old
        output = {k: v.to(device) for k, v in batch.items()}
        output["num_items_in_batch"] = self.accelerator.gather(output["completion_mask"].sum()).sum()
        if self.beta != 0.0:
            output["ref_per_token_logps"] = self._ref_logps(output)
        return output

    def _role_weights(self, rows: list[TrainRow | None]) -> list[float]:
        """Per-row advantage multipliers for one update: `role_share` gives each role its share of the whole pass
        (`rows.pass_role_weights`), `role_mean` the same weight in this update (`rows.role_weights`); both from
        the completion tokens of the update's rows over all processes. TRL's `dapo` divides the token sum by the
        update's tokens, and the clipped loss is linear in a positive advantage scale, so this is exact."""
        all_roles = list(self.sage_pass_tokens)
        counts = torch.zeros(len(all_roles), dtype=torch.float64, device=self.accelerator.device)
        for r in rows:
            if r is not None:
                counts[all_roles.index(r.role)] += len(r.completion_ids)
        counts = self.accelerator.gather(counts[None, :]).sum(dim=0).tolist()
        roles = [None if r is None else r.role for r in rows]
        if self.sage_weighting == "role_share":
            return pass_role_weights(roles, sum(counts), self.sage_pass_tokens, self.sage_shares, self.args.max_steps)
        return role_weights(roles, dict(zip(all_roles, counts)))

    def _process_rows(self) -> list[int | None]:
        """The rows this process trains on over the whole pass, in the sampler's order (None: a dummy): the
        `process_index`-th slice of each of `update_blocks` (`_generate_and_score_completions` checks each row it
        gets was among them)."""
        per, k = self.args.generation_batch_size // self.accelerator.num_processes, self.accelerator.process_index
        return [i for block in self._update_blocks() for i in block[k * per:(k + 1) * per]]

    @torch.no_grad()
    def _old_logps(self) -> dict[int, torch.Tensor]:
        """pi_old of every row this process trains on after the pass's first update: the log-probs of its
        completion tokens under the policy as the pass starts (before any update), at the row's temperature, scored
        once without gradients in passes of `per_device_train_batch_size` rows, longest first. The first update's
        rows are not scored: their own pass comes before any update (with `train.lora_dropout`, a dropout sample of
        the same policy, as when a pass makes one update). Every process makes the
        same number of passes (a sharded model needs them in step), dummy rows included. Keyed by row index, on
        the CPU."""
        if self.state.global_step:
            raise RuntimeError("pi_old must be scored before the pass's first update")
        t0 = time.perf_counter()
        rows = self.sage_rows
        first = self.args.generation_batch_size // self.accelerator.num_processes  # this process's first block
        mine = sorted(self._process_rows()[first:],  # dummies last
                      key=lambda i: -1 if i is None else -len(rows[i].prompt_ids) - len(rows[i].completion_ids))
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        bs, out = self.args.per_device_train_batch_size, {}
        training = self.model.training
        self.model.eval()  # pi_old without dropout (`train.lora_dropout`): the policy itself, not a sample of it
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for start in range(0, len(mine), bs):
                chunk = mine[start:start + bs]
                batch = {k: v.to(self.accelerator.device) for k, v in
                         stored_batch([None if i is None else self.sage_rows[i] for i in chunk], pad, None,
                                      False).items()}
                logps = self._get_per_token_logps_and_entropies(
                    self.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                    torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
                    batch["completion_ids"].size(1), batch_size=bs, temperatures=batch["temperatures"])[0].float().cpu()
                for j, i in enumerate(chunk):
                    if i is not None:
                        out[i] = logps[j, :len(self.sage_rows[i].completion_ids)].clone()
        self.model.train(training)
        self.sage_old_seconds += time.perf_counter() - t0
        return out

    @torch.no_grad()
    def _ref_logps(self, batch):
        """The reference policy's log-probs (`beta != 0`): with the adapter disabled (the base model) for a new
        adapter, through TRL's "ref" copy of it for a retrained one (TRL builds no reference model for PEFT)."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._get_per_token_logps_and_entropies(self.model, input_ids, attention_mask,
                                                           batch["completion_ids"].size(1),
                                                           batch_size=self.args.per_device_train_batch_size,
                                                           temperatures=batch["temperatures"])[0]

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, temperatures=None,
                                           **multimodal):
        """TRL's method, for text rows: each row at its temperature (`temperatures`; from TRL's loss, which passes
        none, the micro-batch's own, `sage_scoring`), in chunks of `batch_size` rows. Returns (log-probs, entropies
        or None, None). For TRL's loss, with the importance correction on, it then weighs the micro-batch's
        advantages by these log-probs (`_weigh`): TRL's loss reads them after this call."""
        scoring, self.sage_scoring = self.sage_scoring, None
        if temperatures is None and scoring is not None:
            temperatures = scoring["temperatures"]
        if temperatures is None or len(temperatures) != input_ids.size(0):
            raise RuntimeError("per-row temperatures were not given for this batch")
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = start + batch_size
            with self._autocast(input_ids.device):
                lp, ent = completion_logprobs(model, input_ids[start:end], attention_mask[start:end],
                                              logits_to_keep, temperatures[start:end], entropy=compute_entropy)
            logps.append(lp)
            entropies.append(ent)
        logps = torch.cat(logps)
        if scoring is not None and self.sage_importance_cap is not None:
            self._weigh(scoring, logps.detach())
        return logps, (torch.cat(entropies) if compute_entropy else None), None

    def _weigh(self, inputs: dict, current: torch.Tensor) -> None:
        """Multiply the micro-batch's advantages (in `inputs`, which TRL's loss reads next) per token by the
        importance weights of its corrected rows (`importance_weights`, pi_old against the stored sampling
        log-probs; pi_old is `old_per_token_logps` when the batch carries it, else `current`, the detached
        log-probs of the loss's own pass), and add the weights to the update's statistics over all processes."""
        old = inputs.get("old_per_token_logps")
        old = current if old is None else old
        mask = inputs["completion_mask"] * inputs["corrected"][:, None]
        assert self.sage_importance_cap is not None
        weights, capped = importance_weights(old, inputs["sampling_per_token_logps"], mask, self.sage_importance_cap)
        inputs["advantages"] = inputs["advantages"][:, None] * weights
        on = mask.bool()
        stats = torch.stack([on.sum(), weights[on].sum(), capped.sum()]).double()
        stats = self.accelerator.gather(stats[None, :]).sum(dim=0).tolist()
        low = weights[on].min() if on.any() else torch.tensor(math.inf, device=weights.device)
        low = float(self.accelerator.gather(low.float()[None]).min())
        acc = self.sage_importance
        self.sage_importance = [acc[0] + stats[0], acc[1] + stats[1], acc[2] + stats[2], min(acc[3], low)]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's, with the update's importance statistics (`IMPORTANCE_LOGS`) added when it corrected any token."""
        tokens, total, capped, low = self.sage_importance
        if tokens > 0 and "loss" in logs:
            logs.update({"importance/ratio_mean": total / tokens, "importance/ratio_min": low,
                         "importance/capped_fraction": capped / tokens})
            self.sage_importance = [0.0, 0.0, 0.0, math.inf]
        super().log(logs, start_time)

    def _autocast(self, device):
        """The forward's autocast: to the base model's dtype when that is bf16 (the float32 LoRA weights are cast
        to it, their gradients and AdamW stay float32), else the accelerator's (mixed precision or off)."""
        if self.sage_compute_dtype is None:
            return self.accelerator.autocast()
        return torch.autocast(device_type=device.type, dtype=self.sage_compute_dtype)

    def _compute_loss(self, model, inputs):
        # A micro-batch keeps the padding of its whole generation batch; drop the columns it does not use.
        inputs = dict(inputs)  # `_weigh` replaces its advantages: never those of the buffered batch
        pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
        p_used = pm.any(dim=0).nonzero()
        p0 = int(p_used[0]) if len(p_used) else pm.size(1) - 1
        c_used = cm.any(dim=0).nonzero()
        c1 = int(c_used[-1]) + 1 if len(c_used) else 1
        if p0 > 0 or c1 < cm.size(1):
            inputs["prompt_ids"] = inputs["prompt_ids"][:, p0:]
            inputs["prompt_mask"] = pm[:, p0:]
            for key in ("completion_ids", "completion_mask", "old_per_token_logps", "ref_per_token_logps",
                        "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask"):
                value = inputs.get(key)
                if isinstance(value, torch.Tensor) and value.dim() == 2:
                    inputs[key] = value[:, :c1]
        self.sage_scoring = inputs  # its temperatures and importance weights reach TRL's log-prob call only so
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self.sage_scoring = None


def _unused_reward(prompts=None, completions=None, **kwargs):
    """TRL requires a reward function; stored rows are already scored, so this is never called."""
    raise RuntimeError("StoredRowsTrainer never scores completions")


def build_trainer(model, tokenizer_path: str, rows: list[TrainRow], cfg: TrainConfig, *, seed: int, device: str,
                  torch_dtype, optimizer_state: dict | None = None, on_step: Callable[[dict], None] | None = None,
                  tracking: dict | None = None):
    """A `StoredRowsTrainer` for one pass over `rows` (all with a non-empty completion): TRL's `GRPOConfig` with one
    update per generation batch, a constant learning rate, no reward scaling, the rows' indices as its dataset;
    and the list it fills with TRL's per-update logs as `train()` runs. `optimizer_state` ({"optimizer",
    "scheduler"} state dicts of the previous iteration's trainer) is loaded into the new optimizer and scheduler.
    `on_step` gets each update's `step_record` as it ends. The caller removes `trainer.args.output_dir`.

    `cfg.report_to` names the trackers transformers reports each update's logs to; `tracking` says where:
    `run_name` (the tracker run's name), `logging_dir` (TensorBoard's event files; transformers would put them under
    the temporary output directory, which is removed) and `step_offset` (the run's updates before this pass, so
    TensorBoard draws one curve per run at `training_curve`'s global step)."""
    bs, ga = cfg.minibatch_size, cfg.grad_accum
    if bs * ga == 1:  # TRL needs num_generations >= 2 dividing the generation batch
        bs = 2
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="sage-trl-"),
        per_device_train_batch_size=bs, gradient_accumulation_steps=ga, steps_per_generation=ga,
        # the smallest divisor >= 2 of the generation batch: TRL requires one, nothing here uses it
        num_generations=next(g for g in range(2, bs * ga + 1) if bs * ga % g == 0),
        num_iterations=1,
        max_steps=1,  # set below, once the number of processes is known
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, optim="adamw_torch",
        max_grad_norm=cfg.max_grad_norm, epsilon=cfg.clip_eps_low, epsilon_high=cfg.clip_eps_high,
        beta=cfg.kl_beta, loss_type=cfg.loss_type, scale_rewards="none",
        max_completion_length=max(len(r.completion_ids) for r in rows),  # dr_grpo's constant normaliser
        temperature=1.0,  # each row's own temperature is applied by `_get_per_token_logps_and_entropies`
        gradient_checkpointing=cfg.gradient_checkpointing,
        bf16=torch_dtype == torch.bfloat16 and not device.startswith("cpu"), use_cpu=device.startswith("cpu"),
        report_to=list(cfg.report_to), run_name=(tracking or {}).get("run_name"),
        save_strategy="no", logging_steps=1, logging_strategy="steps", disable_tqdm=True,
        seed=seed, data_seed=seed, shuffle_dataset=True, remove_unused_columns=False,
        ddp_find_unused_parameters=False,  # every LoRA weight is used in every pass: DDP need not search
        dataloader_num_workers=0, log_completions=False,
    )
    args.max_steps = math.ceil(len(rows) / args.generation_batch_size)  # one update per generation batch
    log = UpdateLog(on_step)
    trainer = StoredRowsTrainer(
        model=model, reward_funcs=_unused_reward, args=args,
        train_dataset=Dataset.from_dict({"row": list(range(len(rows))) + [-1]}),
        processing_class=AutoTokenizer.from_pretrained(tokenizer_path), rows=rows, callbacks=[log],
        weighting=cfg.loss_weighting, shares=cfg.role_shares, optimizer_state=optimizer_state,
        compute_dtype=adapter_compute_dtype(torch_dtype),
        importance_cap=cfg.importance_cap if cfg.importance_correction else None,
        sampler_old=cfg.old_policy == "sampler")
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    tracking = tracking or {}
    if any(isinstance(c, TensorBoardCallback) for c in trainer.callback_handler.callbacks):
        trainer.remove_callback(TensorBoardCallback)
        logging_dir = tracking.get("logging_dir")
        trainer.add_callback(RunTensorBoard(None if logging_dir is None else str(logging_dir),
                                            int(tracking.get("step_offset") or 0)))
    # Each update's tokens, over all processes: the sampler is seeded and the same on every process.
    log.block_tokens = [sum(len(rows[i].prompt_ids) + len(rows[i].completion_ids) for i in block if i is not None)
                        for block in trainer._update_blocks()]
    return trainer, log.steps
