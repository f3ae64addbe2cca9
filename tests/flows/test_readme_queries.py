"""The README's warehouse cookbook ("Questions to ask your warehouse") runs, as printed, against a real run's
warehouse through `sage sql`: every query succeeds, and the ones about a run's iterations return rows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sage.warehouse import Warehouse
from tests.flows import scripted_run

README = Path(__file__).resolve().parents[2] / "README.md"


def cookbook() -> list[str]:
    text = README.read_text()
    section = text[text.index("### Questions to ask your warehouse"):]
    block = re.search(r"```sql\n(.*?)```", section, re.S).group(1)
    statements = [s.strip() for s in block.split(";")]
    return [s for s in statements if any(not line.startswith("--") for line in s.splitlines() if line.strip())]


@pytest.fixture(scope="module")
def run_dir(prefect_api, tmp_path_factory):
    d = tmp_path_factory.mktemp("cookbook")
    scripted_run.run(d)
    return d


def test_every_cookbook_query_runs_on_a_real_run(run_dir):
    queries = cookbook()
    assert len(queries) >= 8
    with Warehouse.open(run_dir / "warehouse.duckdb", read_only=True) as wh:
        run_id = wh.scalar("SELECT run_id FROM runs")
        question = wh.scalar("SELECT question_id FROM rollouts WHERE purpose = 'critique_question' LIMIT 1")
    for sql in queries:
        sql = re.sub(r"'run-[0-9a-f]{8}'", f"'{run_id}'", sql).replace("<question_id>", question)
        out = subprocess.run([sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(run_dir), "--format", "csv",
                              "--", sql], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (sql, out.stderr[-2000:])
        lines = out.stdout.splitlines()
        assert lines and "," in lines[0] or len(lines[0].split()) == 1, (sql, out.stdout)   # a header
        if "FROM curriculum_drift" in sql or "FROM role_rewards" in sql or "purpose = 'critique_question'" in sql:
            assert len(lines) >= 2, (sql, out.stdout)                                      # and rows
