"""Dead runs do not look alive: a run or stage whose process was killed outright stays `running` in the warehouse
(nothing could record how it ended), and `sage status` shows it `dead` with the command that resumes, while a
live one stays `running`; a signal right at a stage's start ends it `interrupted`, never `running`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from typer.testing import CliRunner

from sage.flows import record
from sage.flows.cli import app
from sage.flows.record import Interrupted, run_recorded, stopped_by_signals
from sage.stages.context import StageReport
from sage.warehouse import Warehouse
from sage.warehouse.queries import mark_stage_running
from tests.flows.test_interrupt import _start, _wait_for

_OWNER = """
import sys, time
from sage.warehouse import Warehouse
from sage.warehouse.queries import mark_stage_running, set_run_status
wh = Warehouse.open(sys.argv[1])
wh.execute("INSERT INTO runs (run_id, config, config_hash, base_model, seed) VALUES ('r', '{}', 'h', 'm', 1)")
set_run_status(wh, 'r', 'running')
mark_stage_running(wh, 'r', 1, 'verify')
print('ready', flush=True)
time.sleep(600)
"""


def _status(directory) -> str:
    result = CliRunner().invoke(app, ["status", "--dir", str(directory)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def _stored(directory, sql: str):
    with Warehouse.open(directory / "warehouse.duckdb", read_only=True) as wh:
        return wh.rows(sql)


def test_status_tells_a_killed_writer_from_a_live_one(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path / "warehouse.duckdb")],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        shown = _status(tmp_path)
        assert "dead" not in shown and "running" in shown, shown
    finally:
        p.kill()
        p.wait(10)
    shown = _status(tmp_path)
    assert "running" not in shown and "dead" in shown, shown
    assert f"(PID {p.pid}) is gone" in " ".join(shown.split()), shown
    assert "Resume it with the -c and --set it was started with:" in " ".join(shown.split())
    assert "  sage run --run r" in shown.splitlines(), shown   # the command on its own line, to copy
    # status only reads: the stored rows still say `running`; the next writer's run rewrites them
    assert {r["status"] for r in _stored(tmp_path, "SELECT status FROM stage_runs UNION ALL "
                                                   "SELECT status FROM runs")} == {"running"}


def test_a_row_of_this_live_writer_stays_running(tmp_path):
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        wh.execute("INSERT INTO runs (run_id, config, config_hash, base_model, seed) VALUES ('r', '{}', 'h', 'm', 1)")
        mark_stage_running(wh, "r", 1, "verify")
        shown = _status(tmp_path)
        assert "dead" not in shown and "running" in shown, shown
    assert "dead" in _status(tmp_path)  # closed without finishing the stage: nobody runs it now


def test_a_signal_right_at_a_stages_start_ends_it_interrupted(tmp_path, monkeypatch):
    """SIGINT arriving just after the row says `running` (before the stage's first row): the old window between
    marking the stage and guarding it."""
    def marked_then_signalled(*args):
        mark_stage_running(*args)
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs at the next bytecode: back in run_recorded

    monkeypatch.setattr(record, "mark_stage_running", marked_then_signalled)
    called = []
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh, stopped_by_signals():
        try:
            run_recorded(SimpleNamespace(wh=wh), "verify", lambda ctx: called.append(1) or StageReport("verify"),
                         run_id="r", iteration=1)
        except Interrupted:
            pass
        else:
            raise AssertionError("the signal did not stop the stage")
        rows = wh.rows("SELECT status, error FROM stage_runs")
    assert not called
    assert [r["status"] for r in rows] == ["interrupted"] and "SIGINT" in rows[0]["error"], rows


def test_sigkill_mid_stage_shows_the_run_and_stage_dead_with_the_resume_command(tiny_model, tmp_path):
    p, lines = _start(tiny_model, tmp_path)  # `sage run --run stop` of the tiny model
    try:
        _wait_for(lines, "iteration 0 seed:", p)
        deadline = time.monotonic() + 120
        while not _running_stage(tmp_path):
            assert p.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
    stored = _stored(tmp_path, "SELECT status FROM runs WHERE run_id = 'stop'")
    assert stored == [{"status": "running"}]  # what the warehouse says: nothing recorded the kill
    shown = _status(tmp_path)
    assert "dead" in shown and "running" not in shown, shown
    assert f"(PID {p.pid}) is gone" in " ".join(shown.split()), shown
    assert "Resume it, with the config it was started with, by:" in " ".join(shown.split())
    # the whole command on its own line, to copy: the same run, config and directory
    command = next(line for line in shown.splitlines() if line.startswith("  sage run --run stop -c "))
    assert _resumed_hash(command) == _stored(tmp_path, "SELECT config_hash FROM runs")[0]["config_hash"]
    assert f"--set run.dir={tmp_path}" in command
    # the report says so too
    r = CliRunner().invoke(app, ["report", "--run", "stop", "--dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "reports" / "stop" / "index.html").read_text(encoding="utf-8")
    assert "status: dead (its process is gone; `sage status` says how to resume)" in page


def _running_stage(directory) -> bool:
    if not (directory / "warehouse.duckdb").exists():
        return False
    try:
        return bool(_stored(directory, "SELECT 1 FROM stage_runs WHERE status = 'running'"))
    except Exception:  # the writer holds the file for a moment, or has not made the tables yet
        return False


def _resumed_hash(command: str) -> str:
    """The config hash of the run a printed `sage run` command resumes."""
    import shlex

    from sage.configs import config_hash, load_config

    words = shlex.split(command)
    return config_hash(load_config(words[words.index("-c") + 1],
                                   [words[i + 1] for i, w in enumerate(words) if w == "--set"]))


def test_the_resume_command_of_a_dead_run_is_whole():
    """The dead-run hint was a bare `sage run --run R` (the -c and --set left to memory); it is now the command
    whose config is the stored one: the closest profile and a --set for each field that differs."""
    from sage.configs import config_hash, config_json, load_config
    from sage.flows.cli import resume_command

    for profile, sets in [("cpu", ["seeds.n_math=2", "seeds.math_generators={gcd: {max_value: 20}}",
                                   "roles.solver.max_new_tokens=99", "iteration.domains=[math]"]),
                          ("paper-7b", ["train.lr=1e-5", "run.dir=/elsewhere"])]:
        cfg = load_config(profile, sets)
        command = resume_command(config_json(cfg), "r 1", Path("/tmp/a dir"))
        assert command.startswith(f"sage run --run 'r 1' -c {profile} --set ")
        assert _resumed_hash(command) == config_hash(cfg) and "--set 'run.dir=/tmp/a dir'" in command
    assert resume_command("{}", "r", Path(".")) is None and resume_command("not json", "r", Path(".")) is None


def _resumed(wh, stage, written: dict[str, list[dict]], rows_in: int) -> StageReport:
    """Run `stage` of run r, iteration 1 under `run_recorded` twice: an attempt that commits `written` ({table: rows})
    and stops, then one that finds it all done (`rows_in` in, nothing written); the second's report."""
    def stopped(ctx):
        for table, rows in written.items():
            ctx.wh.insert_batch(table, rows)
        raise RuntimeError("stopped after its last batch")

    ctx = SimpleNamespace(wh=wh, cfg=SimpleNamespace(run=SimpleNamespace(snapshot=False)))
    try:
        run_recorded(ctx, stage, stopped, run_id="r", iteration=1)
    except RuntimeError:
        pass
    return run_recorded(ctx, stage, lambda ctx: StageReport(stage, rows_in, 0), run_id="r", iteration=1)


def test_a_resumed_stage_counts_the_rows_of_every_attempt(tmp_path):
    """A critique_question stopped after committing its 4 rollouts, then resumed, wrote nothing more: `sage status`
    showed `4 in, 0 out` beside 4 rows. Its counts now cover every attempt."""
    from sage.configs.names import Purpose, Role, Stage

    rows = [dict(rollout_id=f"r{k}", run_id="r", iteration=1, stage=Stage.CRITIQUE_QUESTION, role=Role.CRITIC,
                 purpose=Purpose.CRITIQUE_QUESTION, question_id=f"q{k}", template="critic@1", prompt_text="p",
                 completion_text="c", prompt_ids=[1], completion_ids=[2], sample_index=0, seed=0) for k in range(4)]

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        report = _resumed(wh, Stage.CRITIQUE_QUESTION, {"rollouts": rows}, rows_in=4)
        assert (report.rows_in, report.rows_out) == (4, 4)
        assert wh.rows("SELECT status, rows_in, rows_out, attempts FROM stage_runs") == \
            [{"status": "done", "rows_in": 4, "rows_out": 4, "attempts": 2}]


def test_a_dead_stage_names_the_stage_command_and_the_whole_run_command():
    """A `sage stage` whose process died under a finished run: the stage's own command, then the whole `sage run`
    that resumes the run with its stored config, each on its own line to copy."""
    from sage.configs import config_json, load_config
    from sage.flows.cli import _say_dead, console

    config = config_json(load_config("cpu", ["iteration.n_plan=5"]))
    with console.capture() as captured:
        _say_dead({"run_id": "r", "status": "done"}, [{"iteration": 2, "stage": "verify", "status": "dead"}],
                  {("r", 2, "verify"): (4242,)}, config, Path("/tmp/p"))
    lines = captured.get().splitlines()
    assert "  sage stage verify --run r --iteration 2" in lines
    assert any(line.startswith("  sage run --run r -c cpu --set iteration.n_plan=5") for line in lines), lines
    assert "or the whole run with the one after it:" in " ".join(captured.get().split())


def test_a_resumed_critique_plan_counts_the_plans_of_every_attempt(tmp_path):
    """critique_plan's rows_out is its Critic rollouts and its plans rows: a resumed attempt that writes nothing more
    still reports both of the earlier attempt's (and challenge its questions, the same way)."""
    from sage.configs.names import Purpose, Role, Stage

    critiques = [dict(rollout_id=f"c{k}", run_id="r", iteration=1, stage=Stage.CRITIQUE_PLAN, role=Role.CRITIC,
                      purpose=Purpose.CRITIQUE_PLAN, question_id=f"q{k}", plan_id=f"p{k}", template="critic@1",
                      prompt_text="p", completion_text="c", prompt_ids=[1], completion_ids=[2], sample_index=0, seed=0)
                 for k in range(3)]
    plans = [dict(plan_id=f"p{k}", run_id="r", iteration=1, question_id=f"q{k}", s_p=0.5, passed=True)
             for k in range(3)]

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        report = _resumed(wh, Stage.CRITIQUE_PLAN, {"rollouts": critiques, "plans": plans}, rows_in=3)
        assert (report.rows_in, report.rows_out) == (3, 6)
