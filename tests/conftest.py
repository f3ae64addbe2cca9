"""Shared fixtures: the tiny local model, a scripted stage context on an in-memory warehouse, CUDA / marker
handling, and the fast tier's guard: a test marked `fast` that starts a process fails."""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Path of a tiny random Llama model + tokenizer with a chat template, built once per session."""
    from sage.engines.llm.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def prefect_api():
    """A Prefect test server for the whole session; its API URL is exported so subprocesses use it too."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        old = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = url
        try:
            yield url
        finally:
            if old is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = old


# Every way a test could start a process: subprocess, fork (multiprocessing's default on Linux), posix_spawn, and
# the call multiprocessing's spawn and forkserver contexts go through.
_PROCESS_STARTERS = [(subprocess.Popen, "__init__"), (os, "fork"), (os, "forkpty"), (os, "posix_spawn"),
                     (os, "posix_spawnp"), (_posixsubprocess, "fork_exec")]


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request, monkeypatch):
    """The `fast` tier (`make test-fast`, `-m fast`) has no sandbox, math worker, server or trainer: there a test
    that starts a process fails (pytest.fail, which `except Exception` cannot swallow into a fallback path). In
    the full suite the guard is off, so a server or pool another test left running may start processes."""
    if "fast" not in (request.config.getoption("markexpr") or "") or request.node.get_closest_marker("fast") is None:
        return

    def refuse(*args, **kwargs):
        pytest.fail("fast tests start no subprocess; drop the fast marker or use the scripted path "
                    "(tests/scripted.py, scripted engines given to Engines)", pytrace=True)

    for owner, name in _PROCESS_STARTERS:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, refuse)


# What every scripted stage test sets: small counts, and no grammar (a ScriptedLLM ignores it, and its token ids are
# bytes, not a model's vocabulary).
SCRIPTED_OVERRIDES = ["iteration.n_challenge=4", "iteration.n_probe=2", "iteration.n_plan=4", "iteration.n_solve=2",
                      "roles.challenger.constrain=false", "roles.planner.constrain=false",
                      "roles.critic.constrain=false", "roles.solver.constrain=false",
                      # plans shown to every answer whose plan passed, as SAGE.md has it (the stage tests check that
                      # loop's gate and reward terms), whatever loop `cpu.yaml` runs; the hints tests set theirs
                      "iteration.hints=always", "train.hinted_prompt=shown", "rewards.solver_plan=0.2",
                      "rewards.solver_gt=0.6"]


@pytest.fixture
def scripted_stage():
    """`make(script, *overrides, iteration=1, wh=None, **engines) -> (ctx, llm)`: a RunContext of run "r" whose
    generator is `ScriptedLLM(script)` (tests/scripted.py), on `wh` or a new in-memory warehouse; `engines` are
    given to `Engines` as they are (a scripted math checker). Opens no file, process or model."""
    from sage.configs import load_config
    from sage.stages.context import Engines, RunContext
    from sage.warehouse import Warehouse
    from tests.scripted import ScriptedLLM

    opened = []

    def make(script, *overrides: str, iteration: int = 1, wh=None, **engines):
        cfg = load_config("cpu", [*SCRIPTED_OVERRIDES, *overrides])
        if wh is None:
            wh = Warehouse.open(":memory:")
            opened.append(wh)
        llm = ScriptedLLM(script)
        ctx = RunContext(cfg=cfg, wh=wh, run_id="r", iteration=iteration, engines=Engines(cfg, llm=llm, **engines))
        opened.append(ctx)
        return ctx, llm

    yield make
    for x in reversed(opened):
        x.close()
