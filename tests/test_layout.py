"""The project's house rules, checked on the source: one installed package (`sage`), layers whose imports only
point down (DESIGN.md), no import circle, orchestration only in flows/, engines/ organised by concept."""

from __future__ import annotations

import ast
import graphlib
import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"flows": "sage.flows", "stages": "sage.stages", "engines": "sage.engines",
           "warehouse": "sage.warehouse", "configs": "sage.configs", "sage": "sage"}
# what each layer may import (DESIGN.md's table; bench/ and tests/ may import everything)
MAY_IMPORT = {"flows": {"stages", "engines", "warehouse", "configs"}, "stages": {"engines", "warehouse", "configs"},
              "engines": {"configs"}, "warehouse": {"configs"}, "configs": set(), "sage": set()}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, module: str) -> set[str]:
    """Every module `path` imports, at any depth of the file (lazy imports count)."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return names


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {i for i in _imports(p, m) if i in mods and i != m} for m, p in mods.items()}


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "sage"


def test_imports_point_down_the_layers():
    wrong = [f"{m} imports {i}" for m, deps in _graph().items() for i in deps
             if i != "sage" and _layer(i) != _layer(m) and _layer(i) not in MAY_IMPORT[_layer(m)]]
    assert not wrong


def test_no_import_circle():
    try:
        graphlib.TopologicalSorter(_graph()).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import circle: {' -> '.join(e.args[1])}") from None


def test_orchestration_stays_in_flows():
    """Prefect and Ray are imported only by flows/ (stages fan out through an injected executor)."""
    leaks = [f"{m} imports {i}" for m, p in _modules().items() if _layer(m) != "flows"
             for i in _imports(p, m) if i.split(".")[0] in ("prefect", "ray", "prefect_ray")]
    assert not leaks


def test_engines_are_organised_by_concept():
    """engines/ holds sub-packages only, each saying in its docstring what it owns."""
    flat = [p.name for p in (ROOT / "engines").glob("*.py") if p.name != "__init__.py"]
    assert flat == []
    for sub in sorted(p for p in (ROOT / "engines").iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = sub / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), f"engines/{sub.name}"


def test_the_wheel_installs_only_sage(tmp_path):
    """`pip install .` adds one top-level package, `sage`, with the profiles and migrations inside it."""
    src = tmp_path / "src"  # a copy, since setuptools builds inside the source tree
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "sage-runs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("sage_evolve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"sage"}
    assert {"sage/configs/cpu.yaml", "sage/configs/accelerate/ddp.yaml", "sage/warehouse/migrations/001_tables.sql",
            "sage/engines/verify/child.py", "sage/flows/cli.py"} <= set(names)


def test_sage_is_a_plain_folder_linking_the_top_level_folders():
    """`sage/` holds its `__init__.py` and one link per top-level folder, so the package is a plain folder that
    setuptools, editors and type checkers read as Python does (docs/decisions.md)."""
    sage = ROOT / "sage"
    entries = {p.name for p in sage.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py"} | (set(FOLDERS) - {"sage"})
    for folder in set(FOLDERS) - {"sage"}:
        link = sage / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), folder


@pytest.mark.parametrize("folder", sorted(set(FOLDERS) - {"sage"}))
def test_a_folder_does_not_import_as_a_bare_package(folder, monkeypatch):
    """From the repository root `flows/` would import as `flows` beside `sage.flows`: two copies of every
    module. The folder refuses, naming the import to use."""
    monkeypatch.syspath_prepend(str(ROOT))
    with pytest.raises(ImportError, match=f"import sage.{folder}, not {folder}"):
        importlib.import_module(folder)
    assert folder not in sys.modules


#: The folders `make lint` type-checks with pyright's `basic` rules (the rest: imports and names only).
TYPED = ("configs", "warehouse", "stages")


def test_the_typed_folders_are_checked_with_basic_rules():
    """Each module of the typed folders turns the rules on itself (`# pyright: basic` on a line of its own, after
    its docstring), so a module added there is checked from its first commit."""
    unchecked = [str(p.relative_to(ROOT)) for folder in TYPED for p in sorted((ROOT / folder).rglob("*.py"))
                 if "\n# pyright: basic\n" not in "\n" + p.read_text(encoding="utf-8")]
    assert unchecked == [], f"add a line `# pyright: basic` after the module docstring of {', '.join(unchecked)}"
