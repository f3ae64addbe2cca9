"""`sage export-parquet`: one run's tables as Hive-partitioned Parquet, for shared storage.

A cluster's workers and notebooks read a run from Parquet instead of opening the DuckDB file (one writer,
and a file lock). DuckDB writes the files itself (`COPY ... PARTITION_BY`); a destination that is not a
local path goes through fsspec (`s3://`, `gs://`, `memory://`, ... whichever fsspec protocol is installed),
registered with DuckDB's `register_filesystem`.

Layout: DEST/<table>/<partition>=<value>/data_0.parquet, plus DEST/_sage_export.json (run, schema version,
row counts). Tables with an iteration are partitioned by it; `questions` by `origin` (seeds and validation
rows are shared by every run and have no iteration); `runs` and `evaluations` are one file each. Exporting
again replaces each table's folder, so DEST always mirrors the warehouse; a DEST holding anything else is
refused, so nothing unrelated is overwritten.
"""
# pyright: basic

from __future__ import annotations

import json
from datetime import UTC, datetime

from sage.warehouse.db import Warehouse

MANIFEST = "_sage_export.json"

# table -> (rows of the run, partition column or None)
TABLES: dict[str, tuple[str, str | None]] = {
    "runs": ("run_id = $run", None),
    "iterations": ("run_id = $run", "iteration"),
    "stage_runs": ("run_id = $run", "iteration"),
    # seeds and validation (run_id NULL) are part of every run's pool and verdicts
    "questions": ("run_id = $run OR run_id IS NULL", "origin"),
    "rollouts": ("run_id = $run", "iteration"),
    "verdicts": ("run_id = $run", "iteration"),
    "plans": ("run_id = $run", "iteration"),
    "scores": ("run_id = $run", "iteration"),
    "checkpoints": ("run_id = $run", "iteration"),
    "evaluations": ("run_id = $run", None),
}


class ExportError(ValueError):
    pass


def _filesystem(dest: str):
    """(fsspec filesystem or None for local paths, path as DuckDB should see it)."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(dest)
    if isinstance(fs, LocalFileSystem):
        return None, path
    return fs, dest.rstrip("/")  # DuckDB routes the URL's protocol to the registered filesystem


def _check_destination(fs, dest: str) -> None:
    import fsspec

    fs = fs or fsspec.filesystem("file")
    if not fs.exists(dest):
        return
    names = {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(dest, detail=False)}
    if names and MANIFEST not in names:
        raise ExportError(f"{dest} already holds files that `sage export-parquet` did not write "
                          f"({', '.join(sorted(names)[:5])}); choose a new or empty destination")


def export_run(wh: Warehouse, run_id: str, dest: str) -> dict[str, int]:
    """Write every table of `run_id` under `dest`; returns rows written per table."""
    if not wh.rows("SELECT 1 FROM runs WHERE run_id = $run", {"run": run_id}):
        raise ExportError(f"no run {run_id!r} in {wh.path}; `sage status` lists the runs")
    fs, root = _filesystem(dest)
    _check_destination(fs, root)
    if fs is None:
        import os

        os.makedirs(root, exist_ok=True)
    counts: dict[str, int] = {}
    with wh.held() as con:  # one connection for the whole export: every table from the same committed state
        if fs is not None:
            con.register_filesystem(fs)
        for table, (where, partition) in TABLES.items():
            select = f"SELECT * FROM {table} WHERE {where}"
            counts[table] = int(wh.scalar(f"SELECT count(*) FROM ({select})", {"run": run_id}))
            if counts[table] == 0:
                continue
            options = f"FORMAT parquet, PARTITION_BY ({partition}), OVERWRITE true" if partition else "FORMAT parquet"
            target = f"{root}/{table}" + ("" if partition else ".parquet")
            con.execute(f"COPY ({select}) TO '{target}' ({options})", {"run": run_id})
    manifest = {"run_id": run_id, "schema_version": wh.schema_version(), "rows": counts,
                "partitions": {t: p for t, (_, p) in TABLES.items()},
                "exported_at": datetime.now(UTC).isoformat(timespec="seconds")}
    text = json.dumps(manifest, indent=2)
    if fs is None:
        with open(f"{root}/{MANIFEST}", "w") as f:
            f.write(text)
    else:
        with fs.open(f"{root}/{MANIFEST}", "w") as f:
            f.write(text)
    return counts
