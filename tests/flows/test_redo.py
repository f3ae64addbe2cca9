"""`sage stage NAME --force` redoes a stage: its rows for the iteration are replaced, its counts are true, the
stages after it become stale, and the next `sage run` redoes exactly those."""

import json
import subprocess
import sys

from sage.warehouse import Warehouse
from tests.flows import scripted_run


def _states(wh) -> dict[str, tuple]:
    return {r["stage"]: (r["status"], r["attempts"]) for r in
            wh.rows("SELECT stage, status, attempts FROM stage_runs WHERE run_id = 'scripted' AND iteration = 1")}


def test_force_verify_after_new_expected_outputs(prefect_api, tmp_path):
    scripted_run.run(tmp_path)
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        q = wh.rows("SELECT question_id, verifier FROM questions WHERE origin = 'generated' AND domain = 'code' "
                    "AND admitted")[0]
        verifier = json.loads(q["verifier"])
        assert verifier["outputs"] == [6, 20, 7]
        # the question's second expected output changes: answers that passed both tests now pass one
        wh.execute("UPDATE questions SET verifier = ? WHERE question_id = ?",
                   [json.dumps({**verifier, "outputs": [6, 21]}), q["question_id"]])
        solved = "SELECT v.s_gt FROM verdicts v JOIN rollouts r USING (rollout_id) WHERE r.purpose = 'solve' " \
                 "AND r.question_id = ? ORDER BY r.rollout_id"
        assert set(r["s_gt"] for r in wh.rows(solved, [q["question_id"]])) == {1.0}
        n_verified = wh.scalar("SELECT count(*) FROM rollouts WHERE purpose = 'solve'")
        rewards_before = {r["rollout_id"]: r["reward"] for r in wh.rows("SELECT rollout_id, reward FROM scores")}

    cmd = [sys.executable, "-m", "sage.flows.cli", "stage", "verify", "--run", "scripted", "--iteration", "1",
           "--dir", str(tmp_path), "--force"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "stale" in r.stdout + r.stderr
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert set(r["s_gt"] for r in wh.rows(solved, [q["question_id"]])) == {0.5}  # the new verdicts
        counts = wh.rows("SELECT rows_in, rows_out FROM stage_runs WHERE stage = 'verify'")[0]
        assert counts == {"rows_in": n_verified, "rows_out": n_verified}  # redone, and counted truthfully
        states = _states(wh)
        assert states["verify"] == ("done", 2)
        assert states["score"][0] == "stale" and states["train"][0] == "stale"
        assert {s for s, (status, _) in states.items() if status == "stale"} == {"score", "train"}
        assert wh.scalar("SELECT status FROM iterations WHERE run_id = 'scripted' AND iteration = 1") == "stale"

    scripted_run.run(tmp_path)  # `sage run` again: redoes score and train, nothing else
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        states = _states(wh)
        assert {s for s, (_, attempts) in states.items() if attempts == 2} == {"verify", "score", "train"}
        assert all(status == "done" for status, _ in states.values())
        assert wh.scalar("SELECT status FROM iterations WHERE run_id = 'scripted' AND iteration = 1") == "done"
        rewards = {r["rollout_id"]: r["reward"] for r in wh.rows("SELECT rollout_id, reward FROM scores")}
        changed = wh.rows("SELECT rollout_id FROM rollouts WHERE purpose = 'solve' AND question_id = ?",
                          [q["question_id"]])
        assert rewards.keys() == rewards_before.keys()
        assert all(rewards[c["rollout_id"]] < rewards_before[c["rollout_id"]] for c in changed)


def test_force_on_a_finished_last_stage_keeps_the_iteration_done(prefect_api, tmp_path):
    scripted_run.run(tmp_path)
    cmd = [sys.executable, "-m", "sage.flows.cli", "stage", "train", "--run", "scripted", "--iteration", "1",
           "--dir", str(tmp_path), "--force"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT status FROM iterations WHERE run_id = 'scripted' AND iteration = 1") == "done"
        assert _states(wh)["train"] == ("done", 2)
