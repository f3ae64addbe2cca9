"""What a training pass reports per optimizer update: TRL's per-update logs, kept for the pass's metrics, and
for each update one `train_steps` record (`step_record`) handed to the caller's `on_step` as the update ends.

TRL does not log tokens, so an update's tokens come from the trainer's seeded sampler (`block_tokens`: the
same block of rows on every process).
"""

from __future__ import annotations

import math
import time
from typing import Callable

from sage.engines.train.rows import TrainRow


def block_tokens(trainer, rows: list[TrainRow]) -> list[int]:
    """Prompt + completion tokens of each update's block of rows, over all processes: the sampler is seeded and
    the same on every process, and yields each block `steps_per_generation` times in a row."""
    indices = list(trainer._get_train_sampler())
    block = trainer.args.generation_batch_size
    stride = block * trainer.args.steps_per_generation * trainer.num_iterations
    return [sum(len(rows[i].prompt_ids) + len(rows[i].completion_ids) for i in indices[start:start + block]
                if 0 <= i < len(rows)) for start in range(0, len(indices), stride)]


def step_record(logs: dict, step: int, updates: int, tokens: int | None, seconds: float) -> dict:
    """One optimizer update as the train stage stores it (`train_steps`): `step` of `updates` in this pass,
    TRL's logged loss, grad norm, entropy, clip fraction (`clip_ratio/region_mean`) and learning rate, the
    tokens of the update's rows, and the wall-clock seconds since the previous update ended."""
    def number(key):
        value = logs.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    return {"step": step, "updates": updates, "loss": number("loss"), "grad_norm": number("grad_norm"),
            "entropy": number("entropy"), "clip_fraction": number("clip_ratio/region_mean"),
            "learning_rate": number("learning_rate"), "tokens": tokens, "seconds": seconds}


class UpdateLog:
    """The per-update logs of one pass (`steps`) and the `on_step` reports; `callback()` is the TrainerCallback
    that feeds it, `block_tokens` is filled once the trainer (and so its sampler) exists."""

    def __init__(self, on_step: Callable[[dict], None] | None = None):
        self.steps: list[dict] = []
        self.block_tokens: list[int] = []
        self.on_step = on_step
        self._last = time.perf_counter()  # when the previous update (or training) ended

    def callback(self):
        from transformers import TrainerCallback

        log = self

        class _Capture(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                log._last = time.perf_counter()

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    log.record(logs, state)

        return _Capture()

    def record(self, logs: dict, state) -> None:
        self.steps.append({k: (float(v) if isinstance(v, (int, float)) else v) for k, v in logs.items()})
        now = time.perf_counter()
        if self.on_step is not None and state.is_world_process_zero:
            k = state.global_step
            tokens = self.block_tokens[k - 1] if k <= len(self.block_tokens) else None
            self.on_step(step_record(logs, k, state.max_steps, tokens, now - self._last))
        self._last = now
