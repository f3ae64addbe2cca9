"""The closed loop on the tiny local model: `sage run` trains an adapter per iteration, the next iteration
generates with it, checkpoint retention deletes what no later stage reads, and a SIGKILL during training re-does
only that training."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sage.engines.llm.tiny import TINY_RUN
from sage.warehouse import Warehouse

SMALL = [*TINY_RUN, "validate.n_math=2", "validate.n_code=2", "train.minibatch_size=4"]


def sage_run(tiny_model, directory, *extra, iterations=1, **kw):
    args = [sys.executable, "-m", "sage.flows.cli", "run", "--run", "loop", "--iterations", str(iterations)]
    for s in [f"run.dir={directory}", f"model.name={tiny_model}", f"model.cache_dir={directory}/models",
              *SMALL, *extra]:
        args += ["--set", s]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_three_iterations_generate_with_previous_adapters(prefect_api, tiny_model, tmp_path):
    """With `train.keep_last=1` retention deletes, after each iteration, every adapter but the newest and the
    best: iteration k still generates and trains from k - 1's adapter and optimizer state, the resumed run and an
    export still work, and the export leaves the optimizer state out."""
    from sage.engines.train import OPTIMIZER_FILE
    from sage.flows.export import ExportError, export_adapter

    p = sage_run(tiny_model, tmp_path, "train.keep_last=1", iterations=3)
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        used = wh.rows("SELECT iteration, list(DISTINCT adapter) AS adapters FROM rollouts "
                       "WHERE purpose <> 'validate' GROUP BY iteration ORDER BY iteration")
        made = {r["iteration"]: r["adapter_path"] for r in wh.rows("SELECT iteration, adapter_path FROM checkpoints "
                                                                   "WHERE iteration > 0")}
        validated = wh.rows("SELECT iteration, adapter FROM rollouts WHERE purpose = 'validate' "
                            "GROUP BY ALL ORDER BY iteration")
        iters = wh.rows("SELECT iteration, adapter_in, adapter_out FROM iterations ORDER BY iteration")
        best = wh.scalar("SELECT iteration FROM checkpoints WHERE is_best")
        pruned = {r["iteration"]: r["pruned"] for r in wh.rows("SELECT iteration, adapter_pruned_at IS NOT NULL AS "
                                                               "pruned FROM checkpoints WHERE iteration > 0")}
        stages = wh.rows("SELECT * FROM stage_runs ORDER BY ALL")
    assert used[0]["adapters"] == [None]
    assert used[1]["adapters"] == [made[1]] and used[2]["adapters"] == [made[2]]
    assert [(i["adapter_in"], i["adapter_out"]) for i in iters] == [(None, made[1]), (made[1], made[2]),
                                                                    (made[2], made[3])]
    assert pruned == {k: k not in (best, 3) for k in (1, 2, 3)}
    for k, path in made.items():  # stored relative to the project directory, there unless retention deleted it
        assert not os.path.isabs(path)
        assert os.path.exists(os.path.join(tmp_path, path, "adapter_config.json")) == (not pruned[k])
    assert os.path.exists(os.path.join(tmp_path, made[3], OPTIMIZER_FILE))  # what iteration 4 starts from
    # validation: the base model (iteration 0), then each iteration's own adapter
    assert validated == [{"iteration": 0, "adapter": None}] + [{"iteration": k, "adapter": made[k]} for k in (1, 2, 3)]

    p = sage_run(tiny_model, tmp_path, "train.keep_last=1", iterations=3)  # resumed: nothing to do, nothing read
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.rows("SELECT * FROM stage_runs ORDER BY ALL") == stages
        exported = export_adapter(wh, "loop", "latest", tmp_path / "export", merge=False)
        with pytest.raises(ExportError, match="checkpoint retention deleted its adapter"):
            export_adapter(wh, "loop", str(min(k for k in pruned if pruned[k])), tmp_path / "gone", merge=False)
    assert (exported / "adapter_model.safetensors").is_file() and not (exported / OPTIMIZER_FILE).exists()


def test_sigkill_during_training_redoes_only_training(prefect_api, tiny_model, tmp_path):
    # train.isolate: training runs in its own process, which gives the test a window to kill the run
    p = sage_run(tiny_model, tmp_path, "train.isolate=true", start_new_session=True)
    adapters = tmp_path / "adapters" / "loop"
    deadline = time.time() + 600
    while not adapters.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert adapters.exists(), "the run never reached the train stage"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT count(*) FROM checkpoints WHERE iteration > 0") == 0
        assert wh.scalar("SELECT status FROM stage_runs WHERE stage = 'train'") == "running"
        generation = "SELECT count(*) FROM rollouts WHERE purpose <> 'validate'"
        rollouts_before = wh.scalar(generation)
    p = sage_run(tiny_model, tmp_path, "train.isolate=true")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        attempts = {r["stage"]: r["attempts"] for r in wh.rows("SELECT stage, attempts FROM stage_runs "
                                                               "WHERE run_id = 'loop'")}
        assert attempts.pop("train") == 2 and set(attempts.values()) == {1}
        assert wh.scalar(generation) == rollouts_before  # validation of iteration 1 comes after training
        assert wh.scalar("SELECT count(*) FROM checkpoints WHERE iteration > 0") == 1
    # a finished iteration is never retrained
    p = sage_run(tiny_model, tmp_path, "train.isolate=true")
    p.communicate(timeout=600)
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT attempts FROM stage_runs WHERE stage = 'train'") == 2


_CLOCK = ("seconds", "time", "tokens_per_s")


def _untimed(value):
    """A JSON value without wall-clock fields (which differ between any two runs); lists of module names (PEFT
    writes `target_modules`, a set, in hash order) compared as sets."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if not any(c in k for c in _CLOCK)}
    if isinstance(value, list):
        items = [_untimed(v) for v in value]
        return frozenset(items) if items and all(isinstance(v, str) for v in items) else items
    return value


def _files(adapter) -> dict[str, object]:
    """An adapter directory's files: bytes, or for JSON files their content without clock fields."""
    import json

    return {p.name: _untimed(json.loads(p.read_text())) if p.suffix == ".json" else p.read_bytes()
            for p in sorted(adapter.iterdir()) if p.is_file()}


def test_resume_after_sigkill_in_training_gives_the_uninterrupted_adapter_bit_for_bit(prefect_api, tiny_model,
                                                                                     tmp_path):
    """Killed while iteration 2 trains (on the optimizer state iteration 1 left beside its adapter), the run
    resumes to the adapter weights, optimizer state and training metrics, byte for byte, that training the same
    stored rows without interruption gives (`sage stage train --force`), and leaves iteration 1's adapter as it
    was. Both trainings read the same warehouse, so what the machine's load does to a verifier's wall-clock
    deadline upstream (a seed's reference run, say) cannot make them differ; only the resume can."""
    import psutil

    from sage.engines.train.step import OPTIMIZER_FILE

    adapters = tmp_path / "adapters" / "loop"
    p = sage_run(tiny_model, tmp_path, "train.isolate=true", iterations=2, start_new_session=True)
    deadline, trainer = time.time() + 900, None
    while trainer is None and p.poll() is None and time.time() < deadline:
        for q in psutil.Process(p.pid).children(recursive=True):
            try:
                if "sage.engines.train" in q.cmdline() and any("iteration-2" in a for a in q.cmdline()):
                    trainer = q
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.1)
    assert trainer is not None, "the run never reached iteration 2's training"
    first = _files(adapters / "iteration-1")  # recorded before iteration 2 began
    assert {"adapter_model.safetensors", OPTIMIZER_FILE, "sage_train_metrics.json"} <= first.keys()
    time.sleep(1.0)  # into the training step
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT count(*) FROM checkpoints WHERE iteration = 2") == 0
    p = sage_run(tiny_model, tmp_path, "train.isolate=true", iterations=2)
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    resumed = _files(adapters / "iteration-2")

    cmd = [sys.executable, "-m", "sage.flows.cli", "stage", "train", "--run", "loop", "--iteration", "2",
           "--dir", str(tmp_path), "--force"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    uninterrupted = _files(adapters / "iteration-2")
    assert uninterrupted.keys() == resumed.keys() and OPTIMIZER_FILE in resumed
    assert [n for n in resumed if resumed[n] != uninterrupted[n]] == []
    assert _files(adapters / "iteration-1") == first


def test_train_steps_stored_per_update_replaced_on_retrain_and_reported(prefect_api, tiny_model, tmp_path):
    """Training in its own process (the stage reads its steps file as it goes): one `train_steps` row per
    optimizer update, steps 1..n_updates with the metrics' numbers; `sage stage train --force` replaces the
    iteration's rows; `sage report` shows the training curve and the new sections."""
    import json

    p = sage_run(tiny_model, tmp_path, "train.isolate=true", iterations=2)
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-3000:]
    db = tmp_path / "warehouse.duckdb"

    def steps_and_updates(wh):
        steps = {k: [r["step"] for r in wh.rows("SELECT step FROM train_steps WHERE iteration = ? ORDER BY step", [k])]
                 for k in (1, 2)}
        updates = {r["iteration"]: json.loads(r["metrics"])["n_updates"]
                   for r in wh.rows("SELECT iteration, metrics FROM checkpoints WHERE iteration > 0")}
        return steps, updates

    with Warehouse.open(db, read_only=True) as wh:
        steps, updates = steps_and_updates(wh)
        assert updates[1] > 0 and all(steps[k] == list(range(1, updates[k] + 1)) for k in (1, 2))
        metrics = json.loads(wh.scalar("SELECT metrics FROM checkpoints WHERE iteration = 2"))
        row_tokens = wh.scalar("SELECT sum(tokens) FROM train_steps WHERE iteration = 2")
        assert row_tokens == metrics["tokens"]
        assert wh.scalar("SELECT max(global_step) FROM training_curve") == updates[1] + updates[2]
        first = wh.rows("SELECT step, created_at FROM train_steps WHERE iteration = 2 ORDER BY step")
        stored = wh.rows("SELECT step, loss FROM train_steps WHERE iteration = 1 ORDER BY step")
    # the Prefect UI followed training: the table of updates, republished at each, and the stage's progress at 100%
    from prefect.artifacts import Artifact

    table = json.loads(Artifact.get("loop-iteration-1-train-steps").data)
    assert [(r["step"], r["loss"]) for r in table] == [(r["step"], pytest.approx(r["loss"], rel=1e-3)) for r in stored]
    assert float(Artifact.get("loop-iteration-1-train-progress").data) == 100.0
    assert float(Artifact.get("loop-iteration-2-solve-progress").data) == 100.0
    # retraining iteration 2 replaces its rows (new created_at), and only those
    cmd = [sys.executable, "-m", "sage.flows.cli", "stage", "train", "--run", "loop", "--iteration", "2",
           "--dir", str(tmp_path), "--force"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    with Warehouse.open(db, read_only=True) as wh:
        assert steps_and_updates(wh) == (steps, updates)
        again = wh.rows("SELECT step, created_at FROM train_steps WHERE iteration = 2 ORDER BY step")
        assert [a["step"] for a in again] == [f["step"] for f in first]
        assert all(a["created_at"] > f["created_at"] for a, f in zip(again, first))
    r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "report", "--run", "loop", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    page = (tmp_path / "reports" / "loop" / "index.html").read_text(encoding="utf-8")
    assert 'src="training_curve.png"' in page and (tmp_path / "reports" / "loop" / "training_curve.png").is_file()
    for section in ("<h2>evaluations</h2>", "<h2>stage_timings</h2>", "sample generations (iteration 2)",
                    "<h2>config</h2>"):
        assert section in page
