"""bench/ and experiments/ are never run as tests, so these keep them honest: every module still imports (a
renamed helper would otherwise go unseen), and none imports a test module or reaches for a private name, which
would tie a benchmark or a study to code that may change under it without notice (DESIGN.md, the `bench/` row)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("bench", "experiments")
FILES = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)
MODULES = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in FILES if p.name != "__init__.py"]
# Names with a leading underscore that are public API (namedtuple's methods, documented os/sys functions).
PUBLIC_UNDERSCORED = {"_asdict", "_replace", "_fields", "_make", "_exit", "_getframe"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORED


def violations(source: str) -> list[str]:
    """(line: what) for each import of `tests`, import of a private name (`from x import _y`, `import x._y`),
    and use of a private attribute (`x._y`) on anything but `self` and `cls`: a module's private function, a
    private attribute of another package's object, a patch of either."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tests" or any(_private(p) for p in parts):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if parts[0] == "tests" or any(_private(p) for p in parts):
                found.append(f"{node.lineno}: from {node.module} import ...")
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


@pytest.mark.parametrize("name", MODULES)
def test_every_module_imports(name):
    importlib.import_module(name)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_no_test_module_and_no_private_name(path):
    assert violations(path.read_text()) == []


def test_the_check_finds_what_it_forbids():
    source = """
from tests.processes import running
import tests.tiny
from sage.stages.seed import _complete_code, question_id
from sage.flows import evolve
evolve._validate = None
llm._fused_ok
self._cache, cls._registry, row._asdict(), obj.__class__
"""
    assert violations(source) == ["2: from tests.processes import ...", "3: import tests.tiny",
                                  "4: from sage.stages.seed import _complete_code", "6: evolve._validate",
                                  "7: llm._fused_ok"]
