"""`sage export`: hand a run's adapter to serving.

Without `--merge` the checkpoint's adapter directory is copied exactly as peft saved it (vLLM serves it with
`--enable-lora --lora-modules`). With `--merge` the run's base model (its stored `model.name`, resolved like
the run resolved it) is loaded with the adapter, merged (`merge_and_unload`) and saved with its tokenizer as
a plain model directory that `from_pretrained` and `vllm serve` load without peft. Merging happens in
float32 and the result is saved in the base model's own dtype. The destination is written through a
temporary sibling directory and a rename, so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from sage.configs import config_from_dict
from sage.warehouse import Warehouse
from sage.warehouse.queries import run_config
from sage.warehouse.validate_queries import BASE, checkpoints_of


class ExportError(ValueError):
    """The run or checkpoint asked for does not exist, or cannot be exported as asked."""


def resolve_checkpoint(wh: Warehouse, run_id: str, checkpoint: str) -> dict:
    """The checkpoints row named by `checkpoint`: 'best', 'latest' (the last trained adapter) or an iteration."""
    if run_config(wh, run_id) is None:
        raise ExportError(f"no run {run_id!r} in {wh.path}; `sage status` lists the runs")
    rows = checkpoints_of(wh, run_id)
    have = ", ".join(str(r["iteration"]) for r in rows) or "none"
    key = str(checkpoint).strip().lower()
    if key == "best":
        best = [r for r in rows if r["is_best"]]
        if not best:
            raise ExportError(f"run {run_id!r} has no best checkpoint yet: no validation has scored it (the best is "
                              f"marked after each `validate`); pass --checkpoint latest or an iteration "
                              f"(checkpoints: {have})")
        return best[0]
    if key == "latest":
        trained = [r for r in rows if r["adapter_path"] != BASE]
        if not trained:
            raise ExportError(f"run {run_id!r} has no trained adapter yet (checkpoints: {have})")
        return trained[-1]
    try:
        iteration = int(key)
    except ValueError:
        raise ExportError(f"checkpoint {checkpoint!r}: use 'best', 'latest' or an iteration number") from None
    found = [r for r in rows if r["iteration"] == iteration]
    if not found:
        raise ExportError(f"run {run_id!r} has no checkpoint for iteration {iteration} (checkpoints: {have})")
    return found[0]


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
    row = resolve_checkpoint(wh, run_id, checkpoint)
    adapter = None if row["adapter_path"] == BASE else Path(row["adapter_path"])
    if adapter is None and not merge:
        raise ExportError(f"checkpoint {checkpoint!r} of run {run_id!r} is iteration {row['iteration']}, the base "
                          f"model itself: there is no adapter to copy; pass --merge to write the base model "
                          f"directory, or serve the base model directly")
    if adapter is not None and not (adapter / "adapter_config.json").is_file():
        raise ExportError(f"adapter directory {adapter} of iteration {row['iteration']} is missing or incomplete "
                          f"(no adapter_config.json)")
    dest = _fresh_dest(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        if merge:
            from sage.engines.llm.models import resolve_model
            from sage.engines.train.merge import merge_adapter

            cfg = config_from_dict(json.loads(run_config(wh, run_id)[0]), source=f"run {run_id}")
            merge_adapter(resolve_model(cfg.model.name, cfg.model.cache_dir), None if adapter is None else str(adapter),
                          tmp)
        else:
            shutil.rmtree(tmp)
            shutil.copytree(adapter, tmp)
        return _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export_command(
        run_id: Annotated[str, typer.Option("--run", help="Run id (see `sage status`).")],
        checkpoint: Annotated[str, typer.Option("--checkpoint", help="'best' (by validation), 'latest' or an "
                                                "iteration number.")] = "best",
        dest: Annotated[Optional[Path], typer.Option("--dest", help="New (or empty) directory to write; default "
                                           "<dir>/exports/<run>-<checkpoint>[-merged].")] = None,
        directory: Annotated[Path, typer.Option("--dir", help="Project directory holding warehouse.duckdb.")]
        = Path("./sage-runs"),
        merge: Annotated[bool, typer.Option("--merge", help="Merge the adapter into the base model and write a "
                                            "model directory (with tokenizer) that transformers and vLLM load.")]
        = False) -> None:
    """Export a checkpoint's LoRA adapter as peft saved it, or with --merge a merged model directory."""
    from sage.warehouse import WarehouseBusy

    path = Path(directory).expanduser() / "warehouse.duckdb"
    try:
        wh = Warehouse.open(path, read_only=True)
    except (WarehouseBusy, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(3) from None
    try:
        if dest is None:
            dest = Path(directory).expanduser() / "exports" / f"{run_id}-{checkpoint}{'-merged' if merge else ''}"
        row = resolve_checkpoint(wh, run_id, checkpoint)
        out = export_adapter(wh, run_id, checkpoint, dest, merge)
    except ExportError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    finally:
        wh.close()
    acc = "" if row["val_accuracy"] is None else f", val_accuracy {row['val_accuracy']:.4f}"
    what = "merged model (with tokenizer)" if merge else "adapter"
    typer.echo(f"run {run_id}, checkpoint {checkpoint} = iteration {row['iteration']} ({row['adapter_path']}{acc})")
    typer.echo(f"wrote {what} to {out}")
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        typer.echo(f"  {f.relative_to(out)}  {f.stat().st_size:,} bytes")
