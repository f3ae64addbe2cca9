"""train: one TRR++ policy-gradient update of the shared LoRA adapter on all roles' rollouts together
(`train.roles` can leave roles out).

Reads: this iteration's scored rollouts (prompt and completion token ids, sampling log-probs, advantage; each
trained at its role's sampling temperature, `roles.<role>.temperature`) and
the adapter the iteration generated with (none in iteration 1: a fresh LoRA). Trains through
`sage.engines.train` (a TRL GRPOTrainer subclass fed stored rows), in this process or, with `train.isolate`
(the GPU default), in its own process that exchanges Parquet files with the flow, so generation and training
never hold GPU memory at once; with `train.accelerate_config` (a name from `configs/accelerate/`: `ddp`,
`deepspeed-zero2`, `fsdp`, `cpu-2proc`, or a path) under `accelerate launch`, data-parallel over its processes.
Writes: one `train_steps` row per optimizer update as the update ends (in this process through the trainer's
callback; from the training process through a JSON-lines file this stage reads while it runs), the adapter to
`<run.dir>/adapters/<run>/iteration-<k>` (atomically; `<run>` as `run_dirname` maps it), then a `checkpoints`
row with the metrics and `iterations.adapter_out`, in one transaction.
Idempotency: a recorded checkpoint is never retrained; a crash mid-training leaves no checkpoint row, so a
re-run trains that iteration again (and only that), first deleting the steps the interrupted attempt stored. Fails: trainer errors propagate.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sage import configs
from sage.configs import ConfigError
from sage.configs.names import Stage
from sage.engines.verify.isolation import die_with_parent
from sage.stages.context import StageContext, StageReport
from sage.stages.score import REWARD_VERSION
from sage.warehouse.queries import (checkpoint_path, clear_train_steps, record_checkpoint, record_train_step,
                                    training_rows)
from sage.warehouse.runs import run_dirname

STAGE = Stage.TRAIN
#: The accelerate config files `train.accelerate_config` can name without a path.
ACCELERATE_DIR = Path(configs.__file__).resolve().parent / "accelerate"


def accelerate_config_path(value: str) -> Path:
    """`train.accelerate_config` as a file: a short name (`ddp` is `configs/accelerate/ddp.yaml`) or a path."""
    for candidate in (ACCELERATE_DIR / f"{value}.yaml", ACCELERATE_DIR / value, Path(value).expanduser()):
        if candidate.is_file():
            return candidate.resolve()
    names = ", ".join(sorted(p.stem for p in ACCELERATE_DIR.glob("*.yaml")))
    raise ConfigError(f"train.accelerate_config {value!r} is neither a file nor a config in {ACCELERATE_DIR}; "
                      f"use one of {names}, or the path of an accelerate config file")


def trainer_command(args: list[str], accelerate_config: str | None = None) -> list[str]:
    """The command that runs `python -m sage.engines.train ARGS`, under `accelerate launch` when a config is set."""
    if not accelerate_config:
        return [sys.executable, "-m", "sage.engines.train", *args]
    import yaml

    path = accelerate_config_path(accelerate_config)
    settings = yaml.safe_load(path.read_text())
    # The launcher that starts several CPU processes without MPI (accelerate's multi-GPU one) does not pass
    # `use_cpu` on to the workers: without being told, each would take a GPU on a machine that has one.
    if isinstance(settings, dict) and settings.get("use_cpu"):
        args = [*args, "--device", "cpu"]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path), "-m", "sage.engines.train",
            *args]


def _failure_text(stderr: str) -> str:
    """The end of stderr; under a launcher, the workers' own traceback lines first (the launcher's summary at
    the end only names the signal that stopped them)."""
    worker = [line for line in stderr.splitlines() if line.startswith("[rank")]
    head = "\n".join(worker[-40:]) + "\n...\n" if worker else ""
    return head + stderr[-3000:]


def sampling_temperature(cfg, role: str) -> float:
    """The temperature `role`'s rollouts were sampled at (`roles.<role>.temperature`), which the trainer takes its
    log-probs at. Greedy rollouts (temperature 0) have no tempered distribution; they train at temperature 1."""
    t = float(getattr(cfg.roles, role).temperature)
    return t if t > 0 else 1.0


def stored_rows(wh, cfg, run_id: str, iteration: int) -> list:
    """The iteration's scored rollouts of the roles `train.roles` lists, as `TrainRow`s, each at its role's
    sampling temperature."""
    from sage.engines.train.rows import TrainRow

    return [TrainRow(prompt_ids=list(r["prompt_ids"]), completion_ids=list(r["completion_ids"]),
                     advantage=float(r["advantage"]), logprobs=None if r["logprobs"] is None else list(r["logprobs"]),
                     role=r["role"], temperature=sampling_temperature(cfg, r["role"]))
            for r in training_rows(wh, run_id, iteration, REWARD_VERSION, [str(role) for role in cfg.train.roles])]


def adapter_dir(ctx: StageContext) -> Path:
    return Path(ctx.cfg.run.dir).expanduser().resolve() / "adapters" / run_dirname(ctx.run_id) / f"iteration-{ctx.iteration}"


class _StepWriter:
    """Stores each optimizer update in `train_steps` as the trainer reports it and shows it on the display
    (optimizer steps done of the pass, tokens trained, the update's loss)."""

    def __init__(self, ctx: StageContext):
        self.ctx, self.tokens = ctx, 0

    def __call__(self, step: dict) -> None:
        record_train_step(self.ctx.wh, self.ctx.run_id, self.ctx.iteration, step)
        self.tokens += step.get("tokens") or 0
        loss = step.get("loss")
        self.ctx.report(STAGE, step["step"], step.get("updates") or step["step"], self.tokens, unit="steps",
                        note="" if loss is None else f"loss {loss:.4f}")


def _read_new_steps(path: Path, offset: int, on_step) -> int:
    """Pass each complete JSON line of `path` after byte `offset` to `on_step`; return the offset after them
    (a line still being written waits for the next call)."""
    if not path.exists():
        return offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if line.strip():
            on_step(json.loads(line))
    return offset + end


def _train_isolated(ctx: StageContext, model_path: str, rows, out: Path, on_step) -> dict:
    """Train in a child process (under `accelerate launch` when configured). The child appends each update to
    a steps file as a JSON line; this process reads the new lines every half second while the child runs and
    passes them to `on_step`, so the steps reach the warehouse as training goes, not at the end."""
    from sage.engines.train.rows import write_rows

    with tempfile.TemporaryDirectory(prefix="sage-train-") as tmp:
        rows_file, metrics_file = Path(tmp) / "rows.parquet", Path(tmp) / "metrics.json"
        steps_file, stderr_file = Path(tmp) / "steps.jsonl", Path(tmp) / "stderr.txt"
        write_rows(rows, rows_file)
        args = ["--in", str(rows_file), "--out", str(out), "--model", model_path,
                "--config", ctx.cfg.train.model_dump_json(), "--metrics", str(metrics_file),
                "--steps", str(steps_file),
                "--seed", str(ctx.cfg.run.seed + ctx.iteration), "--dtype", ctx.cfg.model.dtype]
        if ctx.adapter:
            args += ["--adapter-in", ctx.adapter]
        offset = 0
        with stderr_file.open("w") as stderr:
            proc = subprocess.Popen(trainer_command(args, ctx.cfg.train.accelerate_config), stdout=subprocess.DEVNULL,
                                    stderr=stderr, text=True, preexec_fn=die_with_parent)  # never outlives the pipeline
            try:
                while proc.poll() is None:
                    offset = _read_new_steps(steps_file, offset, on_step)
                    time.sleep(0.5)
            finally:
                if proc.poll() is None:  # this process is being interrupted: the child goes too
                    proc.kill()
                    proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"training process failed (exit {proc.returncode}):\n"
                               f"{_failure_text(stderr_file.read_text(errors='replace'))}")
        _read_new_steps(steps_file, offset, on_step)
        return json.loads(metrics_file.read_text())


def run(ctx: StageContext) -> StageReport:
    from sage.engines.llm.models import resolve_model, trim_heap
    from sage.engines.train.step import train_step

    if not ctx.cfg.train.enabled:
        return StageReport(STAGE, info={"skipped": "train.enabled is false"})
    if checkpoint_path(ctx.wh, ctx.run_id, ctx.iteration):
        return StageReport(STAGE, info={"skipped": "checkpoint exists"})
    if ctx.cfg.train.accelerate_config:  # a misspelt name fails here, before any work
        accelerate_config_path(ctx.cfg.train.accelerate_config)
    rows = stored_rows(ctx.wh, ctx.cfg, ctx.run_id, ctx.iteration)
    out = adapter_dir(ctx)
    if out.exists():  # left by a run killed between saving and recording: train again
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_path = str(resolve_model(ctx.cfg.model.name, ctx.cfg.model.cache_dir))
    clear_train_steps(ctx.wh, ctx.run_id, ctx.iteration)  # an interrupted attempt's steps: this one replaces them
    on_step = _StepWriter(ctx)
    ctx.engines.release("llm")  # the generation model: rebuilt on next use, never held beside the trained copy
    if ctx.cfg.train.isolate or ctx.cfg.train.accelerate_config:
        metrics = _train_isolated(ctx, model_path, rows, out, on_step)
    else:
        metrics = train_step(model_path, ctx.adapter, str(out), rows, ctx.cfg.train,
                             seed=ctx.cfg.run.seed + ctx.iteration, dtype=ctx.cfg.model.dtype, on_step=on_step)
        trim_heap()  # what training freed goes back to the system before validation loads the model again
    # Per-update logs and the per-process row split stay in the adapter's metrics file, out of the warehouse.
    metrics.pop("steps", None)
    metrics.pop("rows_by_rank", None)
    record_checkpoint(ctx.wh, ctx.run_id, ctx.iteration, str(out), metrics)
    return StageReport(STAGE, rows_in=len(rows), rows_out=1,
                       info={k: metrics.get(k) for k in ("loss", "grad_norm", "tokens_per_s")})
