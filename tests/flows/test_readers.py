"""Reading the warehouse while `sage run` writes it: the run holds the DuckDB file only while it commits a batch,
so readers in other processes get in between batches, see committed batches only, and change nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import duckdb

from sage.warehouse import Warehouse
from tests.flows import scripted_run

DATA = {"questions": "question_id", "rollouts": "rollout_id", "verdicts": "rollout_id", "plans": "plan_id",
        "scores": "score_id", "checkpoints": "iteration", "iterations": "iteration",
        "stage_runs": "iteration, stage"}
VOLATILE = {"created_at", "started_at", "finished_at", "seconds", "duration_s", "applied_at", "owner_pid"}


def _dump(directory) -> dict[str, list[dict]]:
    """The data tables, without wall-clock columns, paths made relative to the directory."""
    with Warehouse.open(directory / "warehouse.duckdb", read_only=True) as wh, wh.held():
        out = {}
        for table, key in DATA.items():
            rows = wh.rows(f"SELECT * FROM {table} ORDER BY {key}")
            out[table] = [{c: (v.replace(str(directory), "<dir>") if isinstance(v, str) else v)
                           for c, v in r.items() if c not in VOLATILE} for r in rows]
        return out


def _observe(path) -> dict:
    """One reader's look, through one read-only connection: the stage records, the curriculum view, which
    iterations are done, and the rollouts (per stage) that exist."""
    with Warehouse.open(path, read_only=True) as wh, wh.held():
        return {
            "stages": {(r["iteration"], r["stage"]): r for r in wh.rows(
                "SELECT iteration, stage, status, rows_in, rows_out FROM stage_runs WHERE run_id = 'scripted'")},
            "drift": {r["iteration"]: r for r in wh.rows(
                "SELECT * FROM curriculum_drift WHERE run_id = 'scripted' ORDER BY iteration")},
            "done": {r["iteration"] for r in wh.rows(
                "SELECT iteration FROM iterations WHERE run_id = 'scripted' AND status = 'done'")},
            "rollouts": {(r["iteration"], r["stage"]): set(r["ids"]) for r in wh.rows(
                "SELECT iteration, stage, list(rollout_id) AS ids FROM rollouts WHERE run_id = 'scripted' "
                "GROUP BY ALL")},
        }


def test_readers_during_a_run_see_committed_batches_and_change_nothing(prefect_api, tmp_path):
    """Two iterations of the scripted generator through `sage run`'s own code (`_run_flow`) in a subprocess
    (deterministic rows, so the watched run must equal the reference row for row), read from this process
    between its batches."""
    reference, watched = tmp_path / "reference", tmp_path / "watched"
    scripted_run.run(reference, iterations=2)
    p = subprocess.Popen([sys.executable, "-m", "tests.flows.scripted_run", str(watched), "--iterations", "2",
                          "--as-cli"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True).start()
    deadline = time.monotonic() + 600
    while not any("iteration 0 seed:" in line for line in lines):  # the run and its seeds exist by then
        assert p.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
        time.sleep(0.05)

    looks, cli = [], []
    while p.poll() is None and time.monotonic() < deadline:
        looks.append(_observe(watched / "warehouse.duckdb"))   # raises (failing the test) if a read fails
        if len(looks) % 10 == 0:                                 # and the command users type, now and then
            r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(watched), "--format",
                                "csv", "SELECT count(*) AS n FROM stage_runs"], capture_output=True, text=True,
                               timeout=120)
            cli.append(r)
        time.sleep(0.05)
    assert p.wait(60) == 0, "".join(lines)[-3000:]

    assert len(looks) >= 20 and cli, f"only {len(looks)} reads during the run"
    assert all(r.returncode == 0 and r.stdout.startswith("n\n") for r in cli), [r.stderr for r in cli]
    final = _observe(watched / "warehouse.duckdb")
    assert any(look["rollouts"] for look in looks)  # the reads did land during the run, not only around it
    for look in looks:
        for key, row in look["stages"].items():
            if row["status"] == "done":  # a finished stage is seen with all its rows and its final counts
                assert row == final["stages"][key]
                assert look["rollouts"].get(key, set()) == final["rollouts"].get(key, set())
        for key, ids in look["rollouts"].items():  # every row seen is one the run kept: committed
            assert ids <= final["rollouts"][key]
        for iteration in look["done"]:
            assert look["drift"][iteration] == final["drift"][iteration]
    counts = [sum(map(len, look["rollouts"].values())) for look in looks]
    assert counts == sorted(counts)  # batches appear whole and in order, never withdrawn
    assert _dump(watched) == _dump(reference)


def _untimed_dump(directory) -> dict[str, list[dict]]:
    """`_dump` plus the training steps, without the training metrics' clock fields."""
    import json

    from tests.flows.test_training_loop import _untimed

    out = _dump(directory)
    for row in out["checkpoints"]:
        metrics = json.loads(row["metrics"]) if isinstance(row["metrics"], str) else row["metrics"]
        row["metrics"] = _untimed(metrics)
    with Warehouse.open(directory / "warehouse.duckdb", read_only=True) as wh:
        out["train_steps"] = [{c: v for c, v in r.items() if c not in VOLATILE}
                              for r in wh.rows("SELECT * FROM train_steps ORDER BY iteration, step")]
    assert out["train_steps"], "the run trained"
    return out


def test_readers_during_a_tiny_model_run_including_its_training(prefect_api, tiny_model, tmp_path):
    """The same with the tiny model, training included (train_steps are written while readers read): every read
    succeeds, a finished stage is seen whole, and the warehouse equals that of a run nobody read."""
    from tests.flows.test_training_loop import sage_run

    reference, watched = tmp_path / "reference", tmp_path / "watched"
    p = sage_run(tiny_model, reference)
    assert p.wait(900) == 0, p.stderr.read()[-3000:]
    p = sage_run(tiny_model, watched)
    reads, steps_seen, idle = 0, set(), None
    snapshot, plain, refused = watched / "warehouse.snapshot.duckdb", [], []
    deadline = time.monotonic() + 900
    while p.poll() is None and time.monotonic() < deadline:
        if (watched / "warehouse.duckdb").exists():
            with Warehouse.open(watched / "warehouse.duckdb", read_only=True) as wh, wh.held():
                wh.rows("SELECT * FROM curriculum_drift")
                wh.rows("SELECT * FROM stage_runs")
                steps_seen |= {r["step"] for r in wh.rows("SELECT step FROM training_curve")}
            reads += 1
        if snapshot.exists():
            if idle is None:   # a client in another process that opens the copy and never lets go
                idle = subprocess.Popen([sys.executable, "-c", IDLE_CLIENT, str(snapshot)], stdout=subprocess.PIPE,
                                        text=True)
            for _ in range(3):   # plain DuckDB, as any client: no waiting, no retry
                try:
                    with duckdb.connect(str(snapshot), read_only=True) as con:
                        plain.append(con.execute("SELECT count(*) FILTER (WHERE status = 'done'), "
                                                 "(SELECT count(*) FROM training_curve) FROM stage_runs").fetchone())
                except duckdb.Error as e:
                    refused.append(str(e))
        time.sleep(0.1)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-3000:]   # the idle client held up nothing
    assert reads >= 20 and steps_seen
    assert not refused and len(plain) >= 100, (refused[:3], len(plain))
    assert plain == sorted(plain) and len(set(plain)) > 2   # stage by stage, never going back
    assert any(steps for _, steps in plain)                 # training steps, while the run went on
    assert idle is not None and idle.poll() is None
    idle.kill()
    assert _untimed_dump(watched) == _untimed_dump(reference)
    counts = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t}) AS {t}" for t in DATA)
    with Warehouse.open(watched / "warehouse.duckdb", read_only=True) as live, \
            Warehouse.open(snapshot, read_only=True) as copy:   # the last copy is the finished warehouse
        assert copy.rows(counts) == live.rows(counts)

#: A DuckDB client that opens a file read-only, reads it, and keeps the connection open until killed.
IDLE_CLIENT = ("import duckdb, sys, time\ncon = duckdb.connect(sys.argv[1], read_only=True)\n"
               "print(con.execute('SELECT count(*) FROM stage_runs').fetchone()[0], flush=True)\ntime.sleep(3600)\n")
