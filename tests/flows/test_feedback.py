"""What a user sees before and after the work: a configured Prefect server that is down, the private server
starting, the best checkpoint with its export command, and a hub benchmark that is not available offline. Each
ends in one sentence (exit code 2, no traceback) or one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from sage.flows import api_server
from sage.flows.terminal import console


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sage(*args: str, env: dict[str, str | None] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    full = {**os.environ, "COLUMNS": "400", **(env or {})}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sage.flows.cli", *args], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in full.items() if v is not None})
    return done, time.monotonic() - started


def one_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Retry" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


# ---------------------------------------------------------------------------- a Prefect server that is down

@pytest.mark.fast
def test_check_api_names_the_url_and_the_fix():
    url = f"http://127.0.0.1:{_closed_port()}/api"
    with pytest.raises(api_server.PrefectUnreachable) as e:
        api_server.check_api(url, timeout_s=1)
    assert url in str(e.value) and "prefect server start" in str(e.value) and "unset PREFECT_API_URL" in str(e.value)


@pytest.mark.fast
def test_prefect_api_refuses_a_configured_server_that_is_down(monkeypatch):
    monkeypatch.setattr(api_server, "configured_api", lambda: f"http://127.0.0.1:{_closed_port()}/api")
    said = []
    with pytest.raises(api_server.PrefectUnreachable), api_server.prefect_api(said.append):
        pytest.fail("the block must not run")
    assert said == []  # no private server is started


@pytest.mark.parametrize("command", [["run", "-n", "1"], ["eval", "-b", "math500", "--limit", "1"], ["serve"]])
def test_a_prefect_server_that_is_down_is_one_sentence_before_any_work(tmp_path, command):
    url = f"http://127.0.0.1:{_closed_port()}/api"
    done, seconds = sage(*command, "--set", f"run.dir={tmp_path / 'p'}", env={"PREFECT_API_URL": url})
    line = one_sentence(done)
    assert url in line and "prefect server start" in line and "unset PREFECT_API_URL" in line
    assert not (tmp_path / "p").exists()  # nothing written: checked before the warehouse opens
    assert seconds < 20


def test_verbose_adds_the_traceback(tmp_path):
    done, _ = sage("--verbose", "run", "--set", f"run.dir={tmp_path}",
                   env={"PREFECT_API_URL": f"http://127.0.0.1:{_closed_port()}/api"})
    assert done.returncode == 2 and "Traceback" in done.stderr and "PrefectUnreachable" in done.stderr


# ---------------------------------------------------------------------------- the private server starting

PRIVATE_RUN = """
import os
from prefect import flow
from sage.flows.api_server import prefect_api

@flow(name="sage-private-history-check")
def probe() -> str:
    return os.environ["PREFECT_HOME"]

with prefect_api() as url:
    print(url, probe())
"""


def test_a_private_servers_runs_leave_no_history_in_the_users_prefect_home(tmp_path):
    """The private server keeps its database in a Prefect home of its own, removed when it stops: the user's
    Prefect home (here PREFECT_HOME) gets no prefect.db, so their own `prefect server start` lists none of them."""
    home = tmp_path / "user-prefect-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_URL")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    done = subprocess.run([sys.executable, "-c", PRIVATE_RUN], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("http://127.0.0.1:"), done.stdout
    assert not (home / "prefect.db").exists(), sorted(p.name for p in home.iterdir())


@pytest.mark.fast
def test_starting_a_private_server_is_said_at_once(monkeypatch):
    """`say` hears of the private server before it starts (the start takes seconds); nothing is said for a
    configured one, and --quiet says nothing."""
    from sage.flows.cli import _say
    from sage.flows.progress import LINES, QUIET, Display

    class Started(Exception):
        pass

    def popen(*args, **kwargs):
        raise Started

    said = []
    monkeypatch.setattr(api_server, "configured_api", lambda: None)
    monkeypatch.setattr(api_server.subprocess, "Popen", popen)
    with pytest.raises(Started), api_server.prefect_api(said.append):
        pass
    assert said == [api_server.STARTING] and "private Prefect server" in said[0]
    assert _say(Display(mode=QUIET)) is None
    assert callable(_say(Display(mode=LINES)))


# ---------------------------------------------------------------------------- the best checkpoint

def _best_lines(wh, directory="sage-runs", run_id="run-1") -> str:
    from sage.flows.cli import _best

    with console.capture() as out:
        _best(wh, run_id, directory)
    return out.get()


@pytest.mark.fast
def test_the_summary_names_the_best_checkpoint_and_its_export_command(tmp_path):
    from sage.warehouse import Warehouse

    adapters = tmp_path / "adapters"
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        wh.insert_batch("checkpoints", [dict(run_id="run 1", iteration=i, adapter_path=str(adapters / str(i)),
                                             val_accuracy=acc, is_best=i == 2)
                                        for i, acc in ((1, 0.3), (2, 0.5), (3, 0.4))])
        text = _best_lines(wh, "my dir", "run 1")
    words = " ".join(text.split())  # the console wraps the prose where the adapter's path ends (tmp_path varies)
    assert "best checkpoint: iteration 2 (validation pass@1 0.5," in words and "export it with:" in words
    assert "  sage export --run 'run 1' --checkpoint best --dir 'my dir'" in text.splitlines()  # whole, to copy


@pytest.mark.fast
def test_the_summary_when_the_base_model_is_best_or_nothing_was_validated(tmp_path):
    from sage.warehouse import Warehouse

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        assert _best_lines(wh).strip() == "best checkpoint: none, nothing was validated"
        wh.insert_batch("checkpoints", [dict(run_id="run-1", iteration=1, adapter_path="/a/1")])
        text = _best_lines(wh)
        assert "export the last adapter (iteration 1) with:" in " ".join(text.split())
        assert "  sage export --run run-1 --checkpoint latest --dir sage-runs" in text.splitlines()
        wh.insert_batch("checkpoints", [dict(run_id="run-1", iteration=0, adapter_path="base", val_accuracy=0.25,
                                             is_best=True)])
        text = _best_lines(wh)
    assert "best checkpoint: the base model (iteration 0, validation pass@1 0.25)" in " ".join(text.split())
    assert "  sage export --run run-1 --checkpoint best --merge --dir sage-runs" in text.splitlines()


@pytest.mark.fast
def test_the_summary_wraps_its_sentence_at_words_and_keeps_the_command_whole(tmp_path, monkeypatch):
    """At 80 columns the sentence folds between words (it once broke `b|eat` and `--check|point`), and the
    command stands on its own line, unbroken by us, so it copies whole."""
    from sage.flows.terminal import console
    from sage.warehouse import Warehouse

    monkeypatch.setattr(console, "width", 80)
    directory = "/tmp/a-project-directory/with/a/long/path"
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        wh.insert_batch("checkpoints", [dict(run_id="run-a13300c9", iteration=0, adapter_path="base",
                                             val_accuracy=0.0, is_best=True)])
        lines = _best_lines(wh, directory, "run-a13300c9").splitlines()
    command = f"  sage export --run run-a13300c9 --checkpoint best --merge --dir {directory}"
    assert lines[-1] == command and len(command) > 80
    words = " ".join(lines[:-1]).split()
    assert all(len(line) <= 80 for line in lines[:-1]) and "beat" in words and "adapter" in words


# ---------------------------------------------------------------------------- hub benchmarks offline

@pytest.mark.parametrize("env", [
    {"HF_HUB_OFFLINE": "1"},
    {"HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None, "TRANSFORMERS_OFFLINE": None},  # the hub cannot be reached
], ids=["offline", "unreachable"])
def test_a_hub_benchmark_offline_fails_fast_in_one_sentence(tmp_path, env):
    env = {**env, "HF_HOME": str(tmp_path / "hf"), "PREFECT_API_URL": None}
    if "HF_HUB_OFFLINE" in env and env["HF_HUB_OFFLINE"] is None:
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    done, seconds = sage("eval", "-b", "gsm8k", "--set", f"run.dir={tmp_path / 'p'}", env=env)
    line = one_sentence(done)
    assert "gsm8k is not available offline" in line and "-b gsm8k=test.jsonl" in line and "openai/gsm8k" in line
    assert seconds < 20


@pytest.mark.fast
def test_local_files_and_offline_benchmarks_need_no_hub(monkeypatch):
    from sage.flows import eval_command

    monkeypatch.setattr(eval_command, "_hub_reachable", lambda: pytest.fail("the hub was asked"))
    eval_command.check_hub_benchmarks(["humaneval", "math500", "gsm8k=test.jsonl"])


def test_sage_run_ends_with_the_best_checkpoint(prefect_api, monkeypatch, tmp_path):
    """`sage run`'s summary: each iteration's tables, the warehouse once, and last the checkpoint validation chose
    (here the base model: training is off)."""
    from typer.testing import CliRunner

    from sage.flows import session
    from sage.flows.cli import app
    from sage.warehouse import content_id, norm_hash
    from tests.flows import scripted_run
    from tests.scripted import ScriptedLLM

    rid = scripted_run.prepare(tmp_path, "scripted")
    with session.Session(tmp_path) as s:
        q = "What is 1+1?"
        s.warehouse.insert_batch("questions", [dict(question_id=content_id("validation", q), origin="validation",
                                                    domain="math", text=q, verifier={"answer": "2"},
                                                    norm_hash=norm_hash(q), source="test")])
    llm = ScriptedLLM(scripted_run.script)

    class ScriptedSession(session.Session):
        def __init__(self, directory, **kw):
            super().__init__(directory, **{**kw, "engines": {"llm": llm}})

    monkeypatch.setattr(session, "Session", ScriptedSession)
    sets = [x for o in [f"run.dir={tmp_path}", *scripted_run.OVERRIDES] for x in ("--set", o)]
    r = CliRunner().invoke(app, ["run", "--run", rid, "-n", "2", "--quiet", *sets])
    assert r.exit_code == 0, r.output + repr(r.exception)
    out = " ".join(r.output.split())
    assert out.count("warehouse:") == 1 and "iteration 2: roles" in out  # said once, after the last iteration
    assert out.index("iteration 2: roles") < out.index("warehouse:") < out.index("best checkpoint")
    assert " -0 " not in out  # a mean advantage of -0.0 is 0
    assert "best checkpoint: the base model (iteration 0, validation pass@1" in out
    assert f"--checkpoint best --merge --dir {tmp_path}" in out
