import re
import subprocess
import sys
from pathlib import Path

import pytest

from sage.flows.cli import app

README = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def _sage(*args):
    return subprocess.run([sys.executable, "-m", "sage.flows.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_and_a_readme_line(name):
    r = _sage(name, "--help")
    assert r.returncode == 0 and "Usage" in r.stdout
    assert re.search(rf"^- `sage {name}\b[^`]*` — \S", README, re.M), f"README has no line for `sage {name}`"


def test_readme_starts_with_the_commands():
    head = README.split("\n## ")[0]
    assert "make test" in head


def test_status_on_empty_warehouse_says_how_to_start(tmp_path):
    r = _sage("status", "--dir", str(tmp_path))
    assert r.returncode == 0 and "sage seed" in r.stdout


def test_sql_formats(tmp_path):
    from sage.warehouse import Warehouse

    Warehouse.open(tmp_path / "warehouse.duckdb").close()
    r = _sage("sql", "SELECT 1 AS a, 'x' AS b", "--dir", str(tmp_path), "--format", "csv")
    assert r.returncode == 0 and r.stdout.splitlines() == ["a,b", "1,x"]
    r = _sage("sql", "SELECT 1 AS a", "--dir", str(tmp_path), "--format", "json")
    assert r.returncode == 0 and r.stdout.strip() == '[{"a": 1}]'
    r = _sage("sql", "SELECT count(*) AS n FROM questions", "--dir", str(tmp_path))
    assert r.returncode == 0 and "n" in r.stdout
    r = _sage("sql", "SELEC nonsense", "--dir", str(tmp_path))
    assert r.returncode == 2 and "error" in r.stderr.lower()
