"""`sage run`'s evolve flow: validation schedule, best checkpoint, early stopping and resume, on a scripted
validation curve. The iterations themselves are replaced by a stand-in that records an adapter per
iteration (test_iteration.py runs the real ones); validation runs for real on a ScriptedLLM whose answers
depend on the adapter in use."""

from __future__ import annotations

from pathlib import Path

import pytest

from sage.flows import evolve, session
from sage.flows.evolve import stop_decision
from sage.warehouse import Warehouse
from sage.warehouse.queries import record_checkpoint, start_iteration
from tests.flows import scripted_run
from tests.scripted import ScriptedLLM, prompt_text
from tests.stages.test_validate import validation_rows

QUESTIONS = [(f"What is {i}+{i}?", str(2 * i)) for i in range(1, 5)]


@pytest.mark.parametrize("accs, patience, stop, best, since", [
    ([], 2, False, None, 0),
    ([0.1], 1, False, 0, 0),
    ([0.1, 0.1], 1, True, 0, 1),            # a tie is not an improvement; the earliest stays best
    ([0.1, 0.3, 0.2], 2, False, 1, 1),
    ([0.1, 0.3, 0.2, 0.3], 2, True, 1, 2),
    ([0.1, 0.3, 0.2, 0.4], 2, False, 3, 0),
])
def test_stop_decision(accs, patience, stop, best, since):
    d = stop_decision([(3 * i, a) for i, a in enumerate(accs)], patience)
    assert (d.stop, d.best_iteration, d.since_best) == (stop, None if best is None else 3 * best, since)


def curve_llm(right_by_adapter: dict) -> ScriptedLLM:
    """Answers the first `right_by_adapter[adapter]` validation questions right, the rest wrong."""
    def script(req):
        text = prompt_text(req)
        i = next(k for k, (q, _) in enumerate(QUESTIONS) if q in text)
        right = i < right_by_adapter[llm.adapter and Path(llm.adapter).name]  # the adapter, wherever it is
        return f"<answer>\\boxed{{{QUESTIONS[i][1] if right else -1}}}</answer>"
    llm = ScriptedLLM(script)
    return llm


def run_evolve(monkeypatch, directory, run_id, iterations, llm, train: bool) -> tuple[list, list]:
    """evolve_flow with a stand-in iteration that trains adapter `adapter-k` (when `train`); returns
    (summaries, iterations the stand-in ran)."""
    ran = []

    def fake_iteration(directory, run_id, k):
        ran.append(k)
        with session.opened(directory) as s:  # the evolve flow's own session
            wh = s.warehouse
            start_iteration(wh, run_id, k, None)
            if train:
                record_checkpoint(wh, run_id, k, str(Path(directory) / f"adapter-{k}"), {})  # stored relative
        return {"iteration": k}

    monkeypatch.setattr(evolve, "iteration_flow", fake_iteration)
    with session.Session(directory, engines={"llm": llm}):
        return evolve.evolve_flow(str(directory), run_id, iterations), ran


def prepare(directory, run_id, *extra):
    rid = scripted_run.prepare(directory, run_id, list(extra))
    with session.Session(directory) as s:
        s.warehouse.insert_batch("questions", validation_rows(QUESTIONS, []))
    return rid


def test_early_stop_marks_best_and_resumes_from_the_warehouse(prefect_api, monkeypatch, tmp_path):
    rid = prepare(tmp_path, "curve", "train.enabled=true", "validate.every=1", "validate.patience=2")
    # accuracy 0.25, 0.5, 1.0 (best), 0.75, 1.0 (a tie: no improvement) -> stop after iteration 4
    right = {None: 1, "adapter-1": 2, "adapter-2": 4, "adapter-3": 3, "adapter-4": 4, "adapter-5": 4}
    summaries, ran = run_evolve(monkeypatch, tmp_path, rid, 8, curve_llm(right), train=True)
    assert ran == [1, 2, 3, 4] and summaries == [{"iteration": k} for k in ran]
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        cps = wh.rows("SELECT iteration, adapter_path, val_accuracy, is_best FROM validation_curve ORDER BY iteration")
        assert [(c["iteration"], c["adapter_path"], c["val_accuracy"]) for c in cps] == [
            (0, "base", 0.25), (1, "adapter-1", 0.5), (2, "adapter-2", 1.0), (3, "adapter-3", 0.75),
            (4, "adapter-4", 1.0)]
        assert [c["iteration"] for c in cps if c["is_best"]] == [2]
        assert wh.rows("SELECT iteration FROM stage_runs WHERE stage = 'validate' AND status = 'done' "
                       "ORDER BY iteration") == [{"iteration": k} for k in range(5)]
        assert wh.scalar("SELECT status FROM runs WHERE run_id = 'curve'") == "done"
        rollouts = wh.count("rollouts")
    # the UI: one artifact per validation, each the curve so far (one key republished would list alike versions)
    import json

    from prefect.artifacts import Artifact

    curves = {k: Artifact.get(f"curve-validation-{k}") for k in range(5)}
    assert [[int(r["iteration"]) for r in json.loads(curves[k].data)] for k in range(5)] == \
        [list(range(k + 1)) for k in range(5)]
    assert "after iteration 4" in curves[4].description and Artifact.get("curve-validation") is None

    # a re-run in a fresh session: every validation is done (no generation), the decision is taken again
    # from the warehouse, and the run stops at the same place
    llm = curve_llm(right)
    _, ran = run_evolve(monkeypatch, tmp_path, rid, 8, llm, train=True)
    assert ran == [1, 2, 3, 4] and not llm.calls
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.count("rollouts") == rollouts
        assert wh.rows("SELECT iteration FROM checkpoints WHERE is_best") == [{"iteration": 2}]


def test_schedule_and_training_off(prefect_api, monkeypatch, tmp_path):
    # every 2 iterations and after the last; training off: the same base model every time, a flat curve,
    # recorded but never a reason to stop (patience 1 would stop at the first repeat otherwise)
    rid = prepare(tmp_path, "flat", "validate.every=2", "validate.patience=1")
    summaries, ran = run_evolve(monkeypatch, tmp_path, rid, 5, curve_llm({None: 3}), train=False)
    assert ran == [1, 2, 3, 4, 5] and len(summaries) == 5
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        cps = wh.rows("SELECT iteration, adapter_path, val_accuracy, is_best FROM checkpoints ORDER BY iteration")
        assert [(c["iteration"], c["adapter_path"], c["val_accuracy"]) for c in cps] == [
            (0, "base", 0.75), (2, "base", 0.75), (4, "base", 0.75), (5, "base", 0.75)]
        assert [c["iteration"] for c in cps if c["is_best"]] == [0]  # ties: the earliest
        assert wh.scalar("SELECT list(DISTINCT adapter) FROM rollouts WHERE purpose = 'validate'") == [None]
