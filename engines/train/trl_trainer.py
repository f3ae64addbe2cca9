"""The TRL side of a training step: `StoredRowsTrainer`, a small `GRPOTrainer` subclass fed stored rows in the
order of `rows.block_sampler_class` (`build.build_trainer` configures it for one pass over the rows).

SAGE scores and normalises advantages itself (TRR++: per role), so TRL must neither generate nor score nor
re-normalise anything. Nothing here imports TRL, torch or transformers at module import (`from trl import
GRPOTrainer` is slow); they are imported inside the functions that need them, and the class is built once, by
`trainer_class()` (also reachable as `StoredRowsTrainer`, lazily). It overrides private methods of TRL 1.16:

- `_generate_and_score_completions(inputs)` builds the batch from the stored rows: left-padded prompt ids,
  right-padded completion ids, their masks, the stored advantage (one per row), `num_items_in_batch` (completion
  tokens in the generation batch, gathered over processes), each row's sampling temperature
  (`temperatures`), the stored sampling log-probs as `old_per_token_logps` when every row of the pass has them,
  and `ref_per_token_logps` when `beta != 0`. The backends store `log_softmax(logits / T)` at the request's
  sampling temperature T (1 when greedy, see `engines/llm/base.py`), the behaviour policy at the temperature
  the row is trained at, so the ratio compares like with like. Without usable stored log-probs
  TRL uses the current policy's detached log-probs: ratio 1, the plain on-policy gradient -A * grad log pi,
  for every update of the pass.
  It also records which rows this process trained on (`sage_seen`).
- `_prepare_inputs(batch)` is TRL's, except that it cuts the generation batch into micro-batches by length
  instead of at random: longest rows first, so rows of similar length share a padded forward pass and pad less;
  where the passes pack their rows (the CPU attention), dealt in snake order (`rows.dealt`), so every pass
  carries about the same tokens and the largest, which sets the peak memory, is not the update's longest rows
  together; with shared prefixes, grouped by prefix first (each group longest first).
  Which rows make up each update is the sampler's alone; TRL's `dapo` loss (and `grpo`, `dr_grpo`, whose
  micro-batches all have the same row count) sums the same per-row terms however the update is cut.
- `_get_train_sampler()` replaces TRL's `RepeatSampler` (which repeats each prompt `num_generations` times) by a
  plain sampler over the rows: a seeded permutation (or the given order; with `train.update_order: by_prompt`
  a seeded permutation of the prompts, each prompt's rows together), cut into blocks of one generation batch
  (`minibatch_size * grad_accum * processes` rows). Each block is yielded `grad_accum` times in a row, because
  TRL's `_prepare_inputs` turns the first copy into the batch and slices it into `grad_accum` micro-batches for
  the following micro-steps (it never reads the later copies). A short last block is padded with a dummy row
  index, and `_generate_and_score_completions` turns those into fully masked rows (no loss, no gradient).
  Under `accelerate launch` with N processes the block is N times larger and accelerate's dataloader hands
  process k the k-th contiguous slice of it, so the processes train on disjoint rows of the same update.
- `_get_per_token_logps_and_entropies(...)` scores the completion tokens through `sage.engines.train.logprobs`
  instead of TRL's fused head: each row at its own sampling temperature, only the completion tokens that
  exist, the entropy only when TRL asks for it. TRL's own temperature stays 1.0 and its head is never called.
  With `train.share_prefix`, rows that start with a prompt prefix other rows of their update share continue from
  that prefix's keys and values, computed once per update (`sage.engines.train.prefix`); the micro-steps take
  the update's rows grouped by prefix, and `training_step` sends each prefix's gradients back through it after
  its last row's micro-step, so an update holds only the prefixes of the micro-batch at hand.
- `_compute_loss(model, inputs)` drops the padding columns a micro-batch does not use, then calls TRL's.
- `train()` runs TRL's with two CPU-minded settings for its length: under a bf16 base the float32 LoRA weights
  compute in bf16 (autocast casts the small weights; PEFT's cast of every input to float32 is switched off;
  gradients and AdamW stay float32), and on a CPU the model attends through `sage.engines.train.attention`,
  which takes a micro-batch's rows packed end to end into one sequence, no padding (`logprobs.completion_logprobs`).
- With `train.loss_weighting` `role_mean`, each row's advantage is scaled so that every role weighs the same in
  the update (`_sage_role_weights`). `create_optimizer` / `create_scheduler` load the state carried from the
  previous iteration, when given.
"""

from __future__ import annotations

import math

from sage.engines.train import prefix
from sage.engines.train.attention import packs
from sage.engines.train.rows import (TrainRow, block_sampler_class, dealt, longest_first, prompt_groups,
                                     role_weights)

#: Keys `_generate_and_score_completions` returns (the optional ones only when they apply).
BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
              "temperatures")
OPTIONAL_BATCH_KEYS = ("old_per_token_logps", "ref_per_token_logps")


# --------------------------------------------------------------------------------------------------------------
# The trainer subclass


_TRAINER_CLASS = None


def trainer_class():
    """Build (once) the `GRPOTrainer` subclass; importing TRL takes seconds, so it happens only here."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    import torch
    from trl import GRPOTrainer
    from trl.trainer.utils import split_tensor_dict, use_adapter

    from sage.engines.train.logprobs import add_completion_head

    sampler_cls = block_sampler_class()

    class StoredRowsTrainer(GRPOTrainer):
        """`GRPOTrainer` fed stored rollouts: no generation, no reward functions, no advantage normalisation.

        The train dataset holds one column, `row` (an index into `rows`; -1 is the dummy padding row).
        """

        def __init__(self, *args, rows: list[TrainRow], role_mean: bool = False, optimizer_state: dict | None = None,
                     compute_dtype=None, share_prefix: bool = False, by_prompt: bool = False, **kwargs):
            self.sage_rows = list(rows)
            self.sage_groups = prompt_groups(self.sage_rows) if by_prompt else None  # `train.update_order`
            self.sage_share_prefix = share_prefix  # where it is exact (`prefix.usable`)
            self.sage_prefixes = prefix.SharedPrefixes()  # the current update's (`_generate_and_score_completions`)
            self.sage_prefix_tokens_saved = 0
            self.sage_compute_dtype = compute_dtype  # bf16 base + float32 LoRA: the adapter computes in bf16 too
            self.sage_role_mean = role_mean
            self.sage_roles = sorted({r.role for r in rows})  # the same on every process: all read all rows
            self.sage_optimizer_state = optimizer_state  # {"optimizer": ..., "scheduler": ...} carried in
            self.sage_seen: list[int] = []  # indices into `rows` this process trained on, in order
            # Decided once for all rows, not per batch: a per-batch choice would depend on how the rows are
            # split over processes. Stored log-probs are at each row's temperature (see the module docstring).
            self.sage_use_logprobs = bool(rows) and all(r.logprobs is not None for r in rows)
            self.sage_temperatures = None  # of the rows being scored (set by `_compute_loss`, `_sage_ref_logps`)
            super().__init__(*args, **kwargs)
            if self.aux_loss_enabled:
                raise ValueError("the stored-rows trainer does not add a mixture-of-experts router loss; train a "
                                 "dense model or set the model's router_aux_loss_coef to 0")
            add_completion_head(self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model)
            if self.ref_model is not None:
                add_completion_head(self.ref_model)

        # -- optimizer state carried from the previous iteration ---------------------------------------------
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

        def _sage_role_weights(self, rows) -> list[float]:
            """Per-row advantage multipliers that give each role the same weight in the update: TRL's `dapo`
            loss divides the token sum by the block's tokens N, so a row of role r weighted N / (R * T_r)
            (T_r: role r's completion tokens in the block, over all processes; R: roles present) makes the
            loss the mean over roles of per-role token means. The clipped loss is linear in a positive
            advantage scale, so this is exact."""
            counts = torch.zeros(len(self.sage_roles), dtype=torch.float64, device=self.accelerator.device)
            for r in rows:
                if r is not None:
                    counts[self.sage_roles.index(r.role)] += len(r.completion_ids)
            counts = self.accelerator.gather(counts[None, :]).sum(dim=0).tolist()
            return role_weights([None if r is None else r.role for r in rows], dict(zip(self.sage_roles, counts)))

        # -- data ------------------------------------------------------------------------------------------
        def _prepare_inputs(self, generation_batch):
            if not self.model.training:
                return super()._prepare_inputs(generation_batch)
            spg = self.args.steps_per_generation
            if self._step % (spg * self.num_iterations) == 0 or self._buffered_inputs is None:
                batch = longest_first(self._generate_and_score_completions(generation_batch))
                if self.sage_prefixes.prefixes:
                    batch = prefix.grouped(self.sage_prefixes, batch)
                elif packs(self.model):  # packed passes: the same tokens each, not the longest rows together
                    batch = dealt(batch, spg)
                self._buffered_inputs = split_tensor_dict(batch, spg)
            return self._buffered_inputs[self._step % spg]

        def _get_train_sampler(self, dataset=None):
            n = len(self.sage_rows)
            return sampler_cls(n_rows=n, block=self.args.generation_batch_size,
                               repeats=self.args.steps_per_generation * self.num_iterations,
                               dummy=n, shuffle=bool(self.shuffle_dataset), seed=self.args.seed,
                               groups=self.sage_groups)

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
            real = [r for r in rows if r is not None]
            if self.sage_share_prefix:
                self.sage_prefixes = prefix.SharedPrefixes([r.prompt_ids for r in real])
            pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
            p_len = max([len(r.prompt_ids) for r in real] + [1])
            c_len = max([len(r.completion_ids) for r in real] + [1])
            prompt_ids = torch.full((size, p_len), pad, dtype=torch.long)
            prompt_mask = torch.zeros((size, p_len), dtype=torch.long)
            completion_ids = torch.full((size, c_len), pad, dtype=torch.long)
            completion_mask = torch.zeros((size, c_len), dtype=torch.long)
            advantages = torch.zeros(size, dtype=torch.float32)
            temperatures = torch.ones(size, dtype=torch.float32)
            old = torch.zeros((size, c_len), dtype=torch.float32) if self.sage_use_logprobs else None
            weights = self._sage_role_weights(rows) if self.sage_role_mean else [1.0] * len(rows)
            for i, r in enumerate(rows):
                if r is None:  # dummy: one attended prompt token (no fully masked sequence), no completion
                    prompt_mask[i, -1] = 1
                    continue
                p, c = len(r.prompt_ids), len(r.completion_ids)
                prompt_ids[i, p_len - p:] = torch.tensor(r.prompt_ids, dtype=torch.long)
                prompt_mask[i, p_len - p:] = 1
                completion_ids[i, :c] = torch.tensor(r.completion_ids, dtype=torch.long)
                completion_mask[i, :c] = 1
                advantages[i] = float(r.advantage) * weights[i] if self.sage_role_mean else float(r.advantage)
                temperatures[i] = float(r.temperature)
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
                "temperatures": temperatures.to(device),
            }
            if old is not None:
                output["old_per_token_logps"] = old.to(device)
            if self.beta != 0.0:
                output["ref_per_token_logps"] = self._sage_ref_logps(output)
            return output

        @torch.no_grad()
        def _sage_ref_logps(self, batch):
            input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            c_len = batch["completion_ids"].size(1)
            self.sage_temperatures = batch["temperatures"]
            if self.ref_model is not None:
                return self._get_per_token_logps_and_entropies(
                    self.ref_model, input_ids, attention_mask, c_len,
                    batch_size=self.args.per_device_train_batch_size)[0]
            # New adapter: adapters disabled is the base model; retrained adapter: TRL's "ref" copy.
            model = self.accelerator.unwrap_model(self.model)
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                return self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, c_len,
                    batch_size=self.args.per_device_train_batch_size)[0]

        # -- log-probs and loss ------------------------------------------------------------------------------
        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            # The gradients the passes left at a shared prefix go back through it once its last row is done, and
            # at the update's last micro-step (where the Trainer syncs gradients) for any left, before the
            # optimizer steps.
            last = self.accelerator.sync_gradients
            self.sage_prefix_tokens_saved += self.sage_prefixes.release(everything=last)
            return loss

        def train(self, *args, **kwargs):
            from peft.helpers import disable_input_dtype_casting

            from sage.engines.train.attention import use_cpu_attention

            # Under bf16 autocast PEFT's cast of every LoRA input to the float32 adapter dtype (and autocast's cast
            # back) is pure copying: with it off, x stays bf16 and autocast casts the small LoRA weights instead.
            with disable_input_dtype_casting(self.model, active=self.sage_compute_dtype is not None), \
                    use_cpu_attention(self.model, active=self.accelerator.device.type == "cpu"):
                return super().train(*args, **kwargs)

        def _sage_autocast(self, device):
            """The forward's autocast: to the base model's dtype when that is bf16 (the float32 LoRA weights are
            cast to it, their gradients and AdamW stay float32), else the accelerator's (mixed precision or off)."""
            if self.sage_compute_dtype is None:
                return self.accelerator.autocast()
            return torch.autocast(device_type=device.type, dtype=self.sage_compute_dtype)

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                               compute_entropy=False, compute_aux_loss=False, **multimodal):
            """TRL's method, for text rows: each row at its temperature (`sage_temperatures`, set by the caller for
            these rows), in chunks of `batch_size` rows. Returns (log-probs, entropies or None, None)."""
            temperatures = self.sage_temperatures
            if temperatures is None or len(temperatures) != input_ids.size(0):
                raise RuntimeError("per-row temperatures were not set for this batch")
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                end = start + batch_size
                with self._sage_autocast(input_ids.device):
                    lp, ent = prefix.prefixed_logprobs(self.sage_prefixes, model, input_ids[start:end],
                                                       attention_mask[start:end], logits_to_keep,
                                                       temperatures[start:end], entropy=compute_entropy)
                logps.append(lp)
                entropies.append(ent)
            return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

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
            self.sage_temperatures = inputs["temperatures"]
            return super()._compute_loss(model, inputs)

    _TRAINER_CLASS = StoredRowsTrainer
    return StoredRowsTrainer


def __getattr__(name: str):  # `sage.engines.train.trl_trainer.StoredRowsTrainer` without importing TRL at module import
    if name == "StoredRowsTrainer":
        return trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
