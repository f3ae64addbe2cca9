"""Every benchmark still imports: they are never run as tests, so a renamed helper would otherwise go unseen."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "bench").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", BENCH)
def test_the_benchmark_imports(name):
    importlib.import_module(f"bench.{name}")
