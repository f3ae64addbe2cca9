"""`sage export`: hand a run's adapter to serving.

Without `--merge` the checkpoint's adapter directory is copied exactly as peft saved it (vLLM serves it with
`--enable-lora --lora-modules`), with the training metrics beside it and without the optimizer state (twice the
adapter's size, of use only to the next iteration's training). Under `train.adapters` per_role that is the Solver's
adapter; the other roles' (`roles/`) stay in the project. With `--merge` the run's base model (its stored
`model.name`, resolved like the run resolved it) is loaded with the adapter, merged (`merge_and_unload`) and saved
with its tokenizer as a plain model directory that `from_pretrained` and `vllm serve` load without peft. Merging
happens in float32 and the result is saved in the base model's own dtype. The destination is written through a
temporary sibling directory and a rename, so a failed export leaves nothing half-written. A checkpoint whose adapter
checkpoint retention deleted is refused, saying so.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from sage.engines.train import OPTIMIZER_FILE, ROLES_DIR
from sage.warehouse import Warehouse
from sage.warehouse.checkpoints import CheckpointNotFound, resolve_checkpoint


class ExportError(ValueError):
    """The run or checkpoint asked for does not exist, or cannot be exported as asked."""


def _fresh_dest(dest: Path) -> Path:
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ExportError(f"{dest} already exists and is not an empty directory; remove it or pick another --dest")
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest


def _publish(tmp: Path, dest: Path) -> Path:
    os.chmod(tmp, 0o755)
    if dest.exists():  # an empty directory (checked by _fresh_dest)
        dest.rmdir()
    os.rename(tmp, dest)
    return dest


def export_adapter(wh: Warehouse, run_id: str, checkpoint: str, dest: Path, merge: bool) -> Path:
    """Write checkpoint `checkpoint` of `run_id` to `dest` (a new or empty directory) and return `dest`:
    the peft adapter directory, or with `merge` a merged model directory with its tokenizer."""
    from sage.warehouse.runs import RunNotFound, load_run_config  # with the config schema: not at CLI start-up

    try:
        cfg = load_run_config(wh, run_id)
        target = resolve_checkpoint(wh, run_id, checkpoint)
    except (RunNotFound, CheckpointNotFound) as e:
        raise ExportError(str(e)) from None
    adapter = None if target.adapter is None else Path(target.adapter)
    if adapter is None and not merge:
        raise ExportError(f"checkpoint {checkpoint!r} of run {run_id!r} is iteration {target.iteration}, the base "
                          f"model itself: there is no adapter to copy; pass --merge to write the base model "
                          f"directory, or serve the base model directly")
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        raise ExportError(f"adapter directory {adapter} of iteration {target.iteration} is missing or incomplete "
                          f"(no adapter_config.json)")
    dest = _fresh_dest(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        if merge:
            from sage.engines.llm.models import resolve_model
            from sage.engines.train.merge import merge_adapter

            merge_adapter(resolve_model(cfg.model.name, cfg.model.cache_dir), None if adapter is None else str(adapter),
                          tmp)
        else:
            shutil.rmtree(tmp)
            shutil.copytree(adapter, tmp, ignore=shutil.ignore_patterns(OPTIMIZER_FILE, ROLES_DIR))
        return _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export_command(
        run_id: Annotated[str, typer.Option("--run", help="Run id (see `sage status`).")],
        checkpoint: Annotated[str, typer.Option("--checkpoint", help="'best' (by validation), 'latest' or an "
                                                "iteration number.")] = "best",
        dest: Annotated[Path | None, typer.Option("--dest", help="New (or empty) directory to write; default "
                                           "<dir>/exports/<run>-<checkpoint>[-merged].")] = None,
        directory: Annotated[Path, typer.Option("--dir", help="Project directory holding warehouse.duckdb.")]
        = Path("./sage-runs"),
        merge: Annotated[bool, typer.Option("--merge", help="Merge the adapter into the base model and write a "
                                            "model directory (with tokenizer) that transformers and vLLM load.")]
        = False) -> None:
    """Export a checkpoint's LoRA adapter as peft saved it, or with --merge a merged model directory."""
    from sage.flows.progress import QUIET, Display
    from sage.flows.terminal import console, fail
    from sage.warehouse import warehouse_path
    from sage.warehouse.runs import run_dirname

    try:
        wh = Warehouse.open(warehouse_path(directory), read_only=True)
    except FileNotFoundError as e:
        fail(str(e))
    try:
        if dest is None:
            dest = (Path(directory).expanduser() / "exports"
                    / f"{run_dirname(run_id)}-{checkpoint}{'-merged' if merge else ''}")
        with Display(mode=QUIET):  # transformers' and the hub's progress bars off while it loads and saves
            out = export_adapter(wh, run_id, checkpoint, dest, merge)
        target = resolve_checkpoint(wh, run_id, checkpoint)
    except ValueError as e:  # ExportError, an unknown run or checkpoint
        fail(str(e))
    finally:
        wh.close()
    acc = "" if target.val_accuracy is None else f", val_accuracy {target.val_accuracy:.4f}"
    what = "merged model (with tokenizer)" if merge else "adapter"
    console.print(f"run {run_id}, checkpoint {checkpoint} = iteration {target.iteration} ({target.stored}{acc})",
                  highlight=False, soft_wrap=True)
    console.print(f"wrote {what} to {out}", highlight=False, soft_wrap=True)
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        console.print(f"  {f.relative_to(out)}  {f.stat().st_size:,} bytes", highlight=False, soft_wrap=True)
