"""Rows of a local problem file, read one way for seed files and benchmark files alike: JSONL (one object per
line), JSON (a list of objects, or JSONL under a .json name) or Parquet.

Parquet goes through pyarrow, not pandas: pandas turns a missing string into NaN, which a row check would
take for a value. Each row comes with where it came from (`PATH:LINE` for JSONL, `PATH:row N` otherwise), so
a caller's own checks can name the line. A file that cannot be read raises `RowFileError`, whose message
names the file (and the line, where there is one); callers re-raise it as their own error type.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".json", ".parquet")


def file_digest(path: str | Path) -> str | None:
    """SHA-256 of a file's bytes (None when `path` is not a file, e.g. a dataset name): what keys a file's
    loaded rows, so an edited file is loaded again."""
    p = Path(path)
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None


class RowFileError(ValueError):
    """A file that cannot be read as rows; the message says which file, where, and what to do."""


def read_records(path: str | Path) -> list[tuple[str, Any]]:
    """`(where, row)` for each row of `path`, in file order; blank JSONL lines are skipped. Rows are what the
    file holds (a JSONL line may be any JSON value); checking them is the caller's job."""
    path = Path(path)
    if not path.exists():
        raise RowFileError(f"{path}: no such file")
    if path.suffix not in SUFFIXES:
        raise RowFileError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or .parquet")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for a bad file
            raise RowFileError(f"{path}: not a readable Parquet file: {e}") from None
        return [(f"{path}:row {i + 1}", row) for i, row in enumerate(rows)]
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise RowFileError(f"{path}:{line}: not UTF-8 text (byte {e.start}); re-save the file as UTF-8") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise RowFileError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        return [(f"{path}:row {i + 1}", row) for i, row in enumerate(rows)]
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((f"{path}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise RowFileError(f"{path}:{lineno}: not valid JSON ({e.msg}); one object per line") from None
    return records
