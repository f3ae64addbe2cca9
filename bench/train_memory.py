"""Where training's resident memory goes, on the rows a real iteration stored: RSS sampled every 10 ms while
one training pass runs in this (fresh) process, printed after each optimizer update.

    .venv/bin/python -m bench.train_memory RUN_DIR [--iteration 1] [--same N] [--rows N] [--trim] \
        [--set section.field=value]

RUN_DIR is a `sage run` project directory (its warehouse holds the iteration's scored rollouts). `--same N`
trains the first 8 rows N times instead (the same row lengths every update), `--trim` returns freed heap
to the system after each update (`trim_heap`) and prints the RSS after it, the tensors Python holds and
glibc's account of allocated and free heap memory; `--set` overrides the
`cpu.yaml` fields that shape training (e.g. `train.gradient_checkpointing=true`). Environment variables such as
`MALLOC_MMAP_THRESHOLD_` or `ONEDNN_PRIMITIVE_CACHE_CAPACITY` apply as usual. Prints the peak per phase
(imports, model load, training) in MB and the training seconds; never run as a test.
"""

from __future__ import annotations

import argparse
import gc
import time

from bench.iteration import PeakMemory


def malloc_mb() -> str:
    """glibc's own account (`heap_info`): what is allocated, and what is free but still held by the heap."""
    from sage.engines.llm.models import heap_info

    heap = heap_info()
    if heap is None:
        return "no glibc heap account"
    return f"malloc in use {heap['in_use'] >> 20} MB, free in the heap {heap['free'] >> 20} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--iteration", type=int, default=1)
    ap.add_argument("--same", type=int, default=0, help="train the first 8 rows this many times instead")
    ap.add_argument("--rows", type=int, default=0, help="train only the first N rows (0: all)")
    ap.add_argument("--trim", action="store_true", help="trim the heap after each update")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    with PeakMemory(every=0.01) as memory:
        memory.current = "imports"
        import torch

        from bench.train import rss_mb
        from sage.configs import load_config
        from sage.engines.llm.models import resolve_dtype, resolve_model, trim_heap
        from sage.engines.train import step
        from sage.stages.train import stored_rows, train_config
        from sage.warehouse import Warehouse

        cfg = load_config("cpu", args.overrides)
        wh = Warehouse(f"{args.run_dir}/warehouse.duckdb", read_only=True)
        run_id = wh.rows("SELECT run_id FROM runs ORDER BY created_at LIMIT 1")[0]["run_id"]
        rows = stored_rows(wh, cfg, run_id, args.iteration)
        if args.same:
            rows = rows[:8] * args.same
        if args.rows:
            rows = rows[:args.rows]
        print(f"{len(rows)} rows, longest {max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)} tokens")

        memory.current = "load"
        model_path = str(resolve_model(cfg.model.name, cfg.model.cache_dir))
        model = step.load_policy(model_path, None, cfg.train, seed=0, dtype=resolve_dtype(cfg.model.dtype, "cpu"))
        time.sleep(0.05)
        memory.current = "train"

        def on_step(record):
            line = (f"update {record.get('step')}: rss {rss_mb():.0f} MB, "
                    f"peak so far {memory.peaks.get('train', 0) >> 20} MB")
            if args.trim:
                gc.collect()
                trim_heap()
                held = sum(o.numel() * o.element_size() for o in gc.get_objects() if torch.is_tensor(o)) >> 20
                line += f"; trimmed to {rss_mb():.0f} MB (tensors Python holds: {held} MB; {malloc_mb()})"
            print(line, flush=True)

        start = time.perf_counter()
        step.train_model(model, model_path, rows, train_config(cfg), seed=0, device="cpu", on_step=on_step)
        time.sleep(0.05)
    print(f"training {time.perf_counter() - start:.1f} s; peak MB by phase: "
          f"{ {phase: peak >> 20 for phase, peak in memory.peaks.items()} }")


if __name__ == "__main__":
    main()
