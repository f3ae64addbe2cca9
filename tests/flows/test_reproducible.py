"""Two fresh runs of one config on the tiny model are identical row for row in every table (timestamps, timings
and the project directory aside), whether the seeds were loaded by `sage seed` first or by `sage run` itself."""

import json
import re
import subprocess
import sys

from sage.engines.llm.tiny import TINY_RUN
from sage.warehouse import Warehouse

#: Columns and JSON keys that measure time, name the project directory or the owning process: they differ between
#: any two runs.
VARYING = re.compile(r"(_at|_s|_ms|seconds|duration|elapsed|runtime|per_second|time|^dir|cache_dir|_pid)$")


def sage(tiny_model, command: str, directory, *extra: str) -> None:
    args = [sys.executable, "-m", "sage.flows.cli", command]
    for s in [f"run.dir={directory}", f"model.name={tiny_model}", f"model.cache_dir={directory}/models", *TINY_RUN,
              "validate.n_math=2", "validate.n_code=2", "train.minibatch_size=4"]:
        args += ["--set", s]
    r = subprocess.run([*args, *extra], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]


def _plain(value):
    """A value with its time-like and directory-like JSON keys left out."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return _plain(json.loads(value))
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items()) if not VARYING.search(k)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def tables(directory) -> dict[str, list[str]]:
    """Every table's rows, each as canonical JSON without its varying columns, sorted."""
    out = {}
    with Warehouse.open(directory / "warehouse.duckdb", read_only=True) as wh:
        names = [r["table_name"] for r in wh.rows("SELECT table_name FROM information_schema.tables "
                                                  "WHERE table_type = 'BASE TABLE' ORDER BY table_name")]
        for name in names:
            rows = wh.rows(f'SELECT * FROM "{name}"')
            out[name] = sorted(json.dumps({k: _plain(v) for k, v in r.items() if not VARYING.search(k)},
                                          sort_keys=True, default=str) for r in rows)
    return out


def test_two_fresh_runs_are_identical_row_for_row(prefect_api, tiny_model, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    sage(tiny_model, "run", a, "--run", "same", "--iterations", "1")
    sage(tiny_model, "seed", b)  # the seeds loaded by `sage seed`, then the run
    sage(tiny_model, "run", b, "--run", "same", "--iterations", "1")
    first, second = tables(a), tables(b)
    assert first.keys() == second.keys()
    assert first["questions"] and first["rollouts"] and first["verdicts"] and first["scores"]
    differ = {}
    for name in first:
        missing = sorted(set(first[name]) - set(second[name]))
        extra = sorted(set(second[name]) - set(first[name]))
        if missing or extra:
            differ[name] = f"{len(missing)} rows only in a, {len(extra)} only in b\n{missing[:2]}\n{extra[:2]}"
    assert not differ, "\n".join(f"{name}: {what}" for name, what in differ.items())
