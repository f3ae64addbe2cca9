"""Where a training step runs: `train` runs `step.train_step` in this process, or in a child process
(`python -m sage.engines.train`) with `train.isolate`, or under `accelerate launch` with `train.accelerate_config`
(a name from `configs/accelerate/` or a path), data-parallel over its processes.

The child exchanges Parquet rows and JSON metrics with this process through a temporary directory, and
appends each optimizer update to a JSON-lines file that this process reads while the child runs, so `on_step`
hears of every update as it ends, as in process. The child dies with this process.

Nothing here imports torch or TRL at module import; the in-process path imports the trainer when it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from sage import configs
from sage.configs import ConfigError
from sage.configs.schema import TrainConfig
from sage.engines.train.rows import TrainRow, write_rows
from sage.engines.verify.isolation import die_with_parent

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
    path = accelerate_config_path(accelerate_config)
    settings = yaml.safe_load(path.read_text())
    # The launcher that starts several CPU processes without MPI (accelerate's multi-GPU one) does not pass
    # `use_cpu` on to the workers: without being told, each would take a GPU on a machine that has one.
    if isinstance(settings, dict) and settings.get("use_cpu"):
        args = [*args, "--device", "cpu"]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path), "-m", "sage.engines.train",
            *args]


def train(model_path: str, adapter_in: str | None, adapter_out: str, rows: list[TrainRow], cfg: TrainConfig, *,
          seed: int, dtype: str = "auto", on_step: Callable[[dict], None] | None = None,
          tracking: dict | None = None) -> dict:
    """`step.train_step(model_path, adapter_in, adapter_out, rows, cfg, ...)` where `cfg` says: in a child process
    when `cfg.isolate` or `cfg.accelerate_config` is set, else in this one (whose C heap is then trimmed, so what
    training freed goes back to the system before the next stage loads a model). Returns its metrics."""
    if cfg.isolate or cfg.accelerate_config:
        return train_isolated(model_path, adapter_in, adapter_out, rows, cfg, seed=seed, dtype=dtype, on_step=on_step,
                              tracking=tracking)
    from sage.engines.llm.models import trim_heap
    from sage.engines.train.step import train_step

    metrics = train_step(model_path, adapter_in, adapter_out, rows, cfg, seed=seed, dtype=dtype, on_step=on_step,
                         tracking=tracking)
    trim_heap()
    return metrics


def train_isolated(model_path: str, adapter_in: str | None, adapter_out: str, rows: list[TrainRow],
                   cfg: TrainConfig, *, seed: int, dtype: str = "auto",
                   on_step: Callable[[dict], None] | None = None, tracking: dict | None = None) -> dict:
    """`train` in a child process (under `accelerate launch` when `cfg.accelerate_config` is set), reading the
    updates it appends to its steps file every half second while it runs. A failed child raises RuntimeError
    with the end of its stderr."""
    # Named for this process, as the sandbox's temp dirs are, so the sweep (`isolation.sweep_temp_dirs`) removes it
    # once this process is gone (a SIGKILL runs no clean-up); the trainer's own temp dirs go inside it (TMPDIR).
    with tempfile.TemporaryDirectory(prefix=f"sage-train-{os.getpid()}-") as tmp:
        rows_file, metrics_file = Path(tmp) / "rows.parquet", Path(tmp) / "metrics.json"
        steps_file, stderr_file = Path(tmp) / "steps.jsonl", Path(tmp) / "stderr.txt"
        write_rows(rows, rows_file)
        args = ["--in", str(rows_file), "--out", str(adapter_out), "--model", model_path,
                "--config", cfg.model_dump_json(), "--metrics", str(metrics_file), "--steps", str(steps_file),
                "--seed", str(seed), "--dtype", dtype]
        if adapter_in:
            args += ["--adapter-in", adapter_in]
        if tracking:
            args += ["--tracking", json.dumps(tracking)]
        report = on_step or (lambda step: None)
        offset = 0
        with stderr_file.open("w") as stderr:
            proc = subprocess.Popen(trainer_command(args, cfg.accelerate_config), stdout=subprocess.DEVNULL,
                                    stderr=stderr, text=True, preexec_fn=die_with_parent,
                                    env={**os.environ, "TMPDIR": tmp})
            try:
                while proc.poll() is None:
                    offset = _read_new_steps(steps_file, offset, report)
                    time.sleep(0.5)
            finally:
                if proc.poll() is None:  # this process is being interrupted: the child goes too
                    proc.kill()
                    proc.wait()
        if proc.returncode != 0:
            raise RuntimeError(f"training process failed (exit {proc.returncode}):\n"
                               f"{_failure_text(stderr_file.read_text(errors='replace'))}")
        _read_new_steps(steps_file, offset, report)
        return json.loads(metrics_file.read_text())


def _read_new_steps(path: Path, offset: int, on_step: Callable[[dict], None]) -> int:
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


def _failure_text(stderr: str) -> str:
    """The end of stderr; under a launcher, the workers' own traceback lines first (the launcher's summary at
    the end only names the signal that stopped them)."""
    worker = [line for line in stderr.splitlines() if line.startswith("[rank")]
    head = "\n".join(worker[-40:]) + "\n...\n" if worker else ""
    return head + stderr[-3000:]
