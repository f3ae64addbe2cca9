"""`python -m sage.engines.train --in rows.parquet --out ADAPTER --model PATH --config JSON`: one training step
in its own process.

`sage.engines.train.launch` runs this when `train.isolate` is set (so generation and training never hold GPU
memory at once) and under `accelerate launch ... -m sage.engines.train` for data-parallel training. The rows come
as a Parquet file (`sage.engines.train.rows.write_rows`), the adapter goes to `--out` (replaced atomically), the
metrics to `--metrics` as JSON when asked, and with `--steps FILE` each optimizer update as one JSON line
appended to FILE as it ends, which `launch` reads while the process runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sage.configs.schema import TrainConfig


def _load_config(value: str) -> TrainConfig:
    text = Path(value).read_text() if not value.lstrip().startswith("{") and Path(value).is_file() else value
    return TrainConfig.model_validate(json.loads(text))


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run `train_step`, write the metrics; the exit status is 0 on success."""
    ap = argparse.ArgumentParser(prog="python -m sage.engines.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="rows", required=True, help="Parquet rows (prompt_ids, completion_ids, advantage, "
                    "logprobs, role, temperature)")
    ap.add_argument("--out", required=True, help="adapter directory to write (replaced atomically)")
    ap.add_argument("--model", required=True, help="base model directory")
    ap.add_argument("--config", required=True, help="TrainConfig as a JSON string or a JSON file")
    ap.add_argument("--adapter-in", default=None, help="adapter to continue training (default: a fresh LoRA)")
    ap.add_argument("--metrics", default=None, help="write the metrics JSON here too")
    ap.add_argument("--steps", default=None, help="append each optimizer update here as a JSON line as it ends")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tracking", default=None, help="JSON: the trackers' run_name and logging_dir")
    a = ap.parse_args(argv)
    from accelerate import PartialState

    from sage.engines.train.rows import read_rows
    from sage.engines.train.step import train_step

    def on_step(record: dict) -> None:  # called on the main process only, so only it writes the file
        with open(a.steps, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    try:
        metrics = train_step(a.model, a.adapter_in, a.out, read_rows(a.rows), _load_config(a.config),
                             seed=a.seed, device=a.device, dtype=a.dtype, on_step=on_step if a.steps else None,
                             tracking=json.loads(a.tracking) if a.tracking else None)
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
    sys.exit(main(sys.argv[1:]))
