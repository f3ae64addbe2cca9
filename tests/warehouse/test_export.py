"""`sage export-parquet`: a run's tables as partitioned Parquet that pandas reads back equal to the warehouse,
other runs left out, re-export replaces, fsspec URLs work, and a foreign destination is refused untouched."""

from __future__ import annotations

import json

import fsspec
import pandas as pd
import pytest
from typer.testing import CliRunner

from sage.flows.cli import app
from sage.warehouse import Warehouse
from sage.warehouse.export import MANIFEST, TABLES, ExportError, export_run
from tests.flows.test_report import RUN, build


@pytest.fixture
def project(tmp_path):
    directory = tmp_path / "proj"
    with Warehouse.open(directory / "warehouse.duckdb") as wh:
        build(wh)
        build(wh, run_id="other-run")  # must not leak into RUN's export
    return directory


def _normalised(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    df = df[columns].copy()
    for c in columns:  # partition columns come back as categories; lists as numpy arrays
        df[c] = df[c].map(lambda v: None if v is None or (not hasattr(v, "__len__") and pd.isna(v))
                          else (list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v))
        df[c] = df[c].astype(str)
    return df.sort_values(columns).reset_index(drop=True)


def _warehouse_frame(wh: Warehouse, table: str) -> pd.DataFrame:
    where, _ = TABLES[table]
    return wh.query(f"SELECT * FROM {table} WHERE {where}", {"run": RUN})


def test_cli_export_reads_back_equal(project, tmp_path):
    dest = tmp_path / "export"
    result = CliRunner().invoke(app, ["export-parquet", "--run", RUN, str(dest), "--dir", str(project)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["run_id"] == RUN and manifest["rows"]["rollouts"] == 9 + 14  # 14 probe answers (two each)
    assert manifest["rows"]["verdicts"] == 14
    with Warehouse.open(project / "warehouse.duckdb", read_only=True) as wh:
        for table, (_, partition) in TABLES.items():
            expected = _warehouse_frame(wh, table)
            assert manifest["rows"][table] == len(expected)
            if expected.empty:
                assert not (dest / table).exists() and not (dest / f"{table}.parquet").exists()
                continue
            got = pd.read_parquet(dest / (table if partition else f"{table}.parquet"))
            assert sorted(got.columns) == sorted(expected.columns), table
            cols = list(expected.columns)
            pd.testing.assert_frame_equal(_normalised(got, cols), _normalised(expected, cols), check_dtype=False)
    assert sorted(p.name for p in (dest / "rollouts").iterdir()) == ["iteration=1", "iteration=2", "iteration=3"]
    assert sorted(p.name for p in (dest / "questions").iterdir()) == ["origin=generated", "origin=seed"]


def test_reexport_replaces_instead_of_appending(project, tmp_path):
    dest = str(tmp_path / "export")
    with Warehouse.open(project / "warehouse.duckdb", read_only=True) as wh:
        first = export_run(wh, RUN, dest)
        second = export_run(wh, RUN, dest)
    assert first == second
    assert len(pd.read_parquet(f"{dest}/scores")) == first["scores"] == 9


def test_fsspec_destination(project):
    fs = fsspec.filesystem("memory")
    with Warehouse.open(project / "warehouse.duckdb", read_only=True) as wh:
        counts = export_run(wh, RUN, "memory://sage-export/run")
    with fs.open("/sage-export/run/plans/iteration=2/data_0.parquet", "rb") as f:
        assert len(pd.read_parquet(f)) == 4
    assert counts["plans"] == 9
    fs.rm("/sage-export", recursive=True)


def test_foreign_destination_is_refused_untouched(project, tmp_path):
    dest = tmp_path / "notes"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    result = CliRunner().invoke(app, ["export-parquet", "--run", RUN, str(dest), "--dir", str(project)])
    assert result.exit_code == 2 and "did not write" in result.output
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]


def test_unknown_run(project, tmp_path):
    with Warehouse.open(project / "warehouse.duckdb", read_only=True) as wh, pytest.raises(ExportError, match="no run"):
        export_run(wh, "nope", str(tmp_path / "x"))
