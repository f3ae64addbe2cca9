"""Stopping `sage run`: Ctrl-C (SIGINT to the process group) or SIGTERM ends it within seconds with one line
saying how to resume, leaves no process behind, and the same command resumes; SIGKILL of `sage` itself leaves
none of its helpers (the private Prefect server, math workers, sandboxes) alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from bench.orphans import running  # one helper for the tests and the benchmark that watch processes exit
from sage.warehouse import Warehouse
from tests.flows.test_training_loop import SMALL


def _start(tiny_model, directory) -> tuple[subprocess.Popen, list[str]]:
    """`sage run` of the tiny model as a terminal would start it (its own process group), reporting to the
    private Prefect server it starts; its stderr lines are collected as they come."""
    args = [sys.executable, "-m", "sage.flows.cli", "run", "--run", "stop", "-n", "1"]
    for s in [f"run.dir={directory}", f"model.name={tiny_model}", f"model.cache_dir={directory}/models", *SMALL]:
        args += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True).start()
    return p, lines


def _wait_for(lines: list[str], text: str, p: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert p.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_in_seconds_and_it_resumes(tiny_model, tmp_path, sig):
    p, lines = _start(tiny_model, tmp_path)
    _wait_for(lines, "iteration 0 seed:", p)
    time.sleep(3)  # into the seeds or the first stage
    family = psutil.Process(p.pid).children(recursive=True)
    start = time.monotonic()
    os.killpg(p.pid, sig)
    code = p.wait(60)
    took = time.monotonic() - start
    err = "".join(lines)
    assert code == 128 + sig, err[-3000:]
    assert took < 10, f"took {took:.1f} s"
    assert f"interrupted ({signal.Signals(sig).name})" in err and "resume with: sage run" in err
    assert "Traceback" not in err and "Crash detected" not in err, err[-3000:]  # the one line says it
    time.sleep(2)
    assert not running(family)
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT status FROM runs WHERE run_id = 'stop'") == "interrupted"

    p, lines = _start(tiny_model, tmp_path)  # the same command resumes and finishes
    assert p.wait(600) == 0, "".join(lines)[-3000:]
    assert "Warning" not in "".join(lines), "".join(lines)[-3000:]  # e.g. transformers' deprecations via PEFT
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT status FROM runs WHERE run_id = 'stop'") == "done"
        assert {r["status"] for r in wh.rows("SELECT status FROM stage_runs WHERE run_id = 'stop'")} == {"done"}


def test_sigkill_of_sage_leaves_none_of_its_processes(tiny_model, tmp_path):
    p, lines = _start(tiny_model, tmp_path)
    _wait_for(lines, "iteration 0 seed:", p)
    time.sleep(3)
    family = psutil.Process(p.pid).children(recursive=True)
    assert any("prefect" in " ".join(q.cmdline()) for q in family)  # the private server is among them
    os.kill(p.pid, signal.SIGKILL)
    p.wait(30)
    time.sleep(5)
    assert not running(family)


def _now():
    import datetime

    return datetime.datetime.now(datetime.UTC)


def _states_since(began) -> dict[str, list]:
    """The states of the flow runs (and their task runs) the Prefect API saw start after `began`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterStartTime

    with get_client(sync_client=True) as client:
        since = FlowRunFilter(start_time=FlowRunFilterStartTime(after_=began))
        return {"flows": [r.state for r in client.read_flow_runs(flow_run_filter=since)],
                "tasks": [r.state for r in client.read_task_runs(flow_run_filter=since)]}


def test_an_interrupted_run_resumes_to_the_rows_of_an_uninterrupted_one(prefect_api, tmp_path):
    """The scripted generator pauses in the middle of the probe stage (some of its batches committed); Ctrl-C
    then, and the same command again, give every row an uninterrupted run gives. Prefect shows the runs the
    signal stopped as Cancelled, saying so, not as Crashed."""
    from tests.flows import scripted_run
    from tests.flows.test_iteration import dump

    reference = tmp_path / "reference"
    scripted_run.run(reference)
    began = _now()
    directory, marker = tmp_path / "interrupted", tmp_path / "paused"
    p = subprocess.Popen([sys.executable, "-m", "tests.flows.scripted_run", str(directory), "--pause-at-call", "8",
                          "--marker", str(marker), "--as-cli"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), p.stderr.read()[-3000:] if p.poll() is not None else "never paused"
    start = time.monotonic()
    os.killpg(p.pid, signal.SIGINT)
    code = p.wait(60)
    assert code == 130 and time.monotonic() - start < 10
    with Warehouse.open(directory / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT status FROM stage_runs WHERE stage = 'probe'") == "interrupted"
    states = _states_since(began)
    assert states["flows"] and all(s.name == "Cancelled" for s in states["flows"]), states  # not Crashed
    assert all(s.message.startswith("interrupted (SIGINT); committed work is kept; resume with: sage ")
               for s in states["flows"])
    assert "Cancelled" in {s.name for s in states["tasks"]} and "Crashed" not in {s.name for s in states["tasks"]}
    r = subprocess.run([sys.executable, "-m", "tests.flows.scripted_run", str(directory), "--as-cli"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert dump(directory) == dump(reference)
