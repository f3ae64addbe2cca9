"""The GPU install resolves: `pip install -e '.[vllm,test,ray]' -c constraints/gpu.txt`, as `make setup` runs it on a
machine with `nvidia-smi`, with the pip that `python -m venv` gives (the Makefile's), as a dry run on this machine.

A dry run installs nothing, but the index serves no metadata apart from the wheels, so pip downloads every wheel of
the set once (about 4.4 GB with torch's CUDA build): 2 to 3 minutes on a 2-core machine beside other jobs, up to 5
under heavy load (docs/gpu.md). Marked `network`; skipped when the index cannot be reached, or fails mid-run
(`-m 'not network'` leaves it out)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "gpu.txt"
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
# The machine's pip configuration may add local wheels or indexes (this machine kind's find-links holds torch's CPU
# build); a GPU node has none, so the dry run reads the index alone. PIP_INDEX_URL, certificates and timeouts stay.
DROPPED = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_REQUIREMENT", "PIP_NO_INDEX",
           "PIP_USE_FEATURE", "PIP_PRE", "PIP_ONLY_BINARY", "PIP_NO_BINARY", "PIP_TARGET", "PIP_USER")


def _pins() -> dict[str, str]:
    """The exact pins of the constraints file: normalised name -> version."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*={2,3}\s*([^\s;#]+)\s*(#.*)?", line.strip())
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def _index_reachable() -> str | None:
    try:
        with urllib.request.urlopen(f"{INDEX}/vllm/", timeout=15) as r:
            r.read(1)
        return None
    except Exception as e:  # any failure to reach the index is a reason to skip, not a failure
        return f"package index {INDEX} unreachable ({type(e).__name__}: {e})"


@pytest.mark.fast
def test_the_constraints_file_pins_the_decisions():
    """vLLM, the torch it pins and the transformers and prefect that meet its caps are pinned; torch's family with
    `===`, so a local CPU build (`2.13.0+cpu`, which `==2.13.0` admits) is never taken on a GPU node."""
    pins = _pins()
    assert {"vllm", "torch", "torchvision", "torchaudio", "transformers", "prefect", "xgrammar"} <= set(pins)
    for name in ("torch", "torchvision", "torchaudio"):
        assert re.search(rf"^{name}===", CONSTRAINTS.read_text(), re.M), name


@pytest.mark.network
@pytest.mark.timeout(900)
def test_the_gpu_constraints_resolve_with_the_makefiles_pip(tmp_path):
    reason = _index_reachable()
    if reason:
        pytest.skip(reason)
    src = tmp_path / "src"  # a copy, so that building the editable metadata writes nothing into the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "sage-runs"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    pip = venv / "bin" / "pip"
    version = subprocess.run([str(pip), "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
            "TMPDIR": str(tmp_path)}
    report = tmp_path / "report.json"
    start = time.monotonic()
    run = subprocess.run([str(pip), "install", "--dry-run", "--ignore-installed", "--report", str(report),
                          "-e", f"{src}[vllm,test,ray]", "-c", str(CONSTRAINTS)],
                         capture_output=True, text=True, env=env, timeout=840)
    seconds = time.monotonic() - start
    out = run.stdout + run.stderr
    network = (r"ConnectionError|ReadTimeoutError|Read timed out|Max retries exceeded|Temporary failure in name "
               r"resolution|Network is unreachable|Connection reset|IncompleteRead")
    if run.returncode and re.search(network, out) and "ResolutionImpossible" not in out:
        pytest.skip(f"the index failed mid-run: {out[-500:]}")
    assert run.returncode == 0, f"pip {version} could not resolve the GPU set:\n{out[-4000:]}"
    # pip backtracking through many releases says so; the pins exist so that it does not
    assert "taking longer than usual" not in out and "still looking at multiple versions" not in out, out[-4000:]
    resolved = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    wrong = {n: (v, resolved.get(n)) for n, v in _pins().items() if resolved.get(n) != v}
    assert not wrong, f"pinned vs resolved: {wrong}"
    assert {"sage-evolve", "trl", "peft", "fastapi", "ray", "prefect-ray"} <= set(resolved)
    print(f"pip {version}: resolved {len(resolved)} packages in {seconds:.0f} s; "
          + ", ".join(f"{n} {resolved[n]}" for n in ("torch", "vllm", "transformers", "trl", "peft", "prefect",
                                                    "fastapi")))
