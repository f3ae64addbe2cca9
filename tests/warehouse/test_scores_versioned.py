"""`scores` rows carry the reward-formula version in their id: old and new rewards never share a row, a
re-score is visible beside the old rows, and training and `role_rewards` read the newest version only."""

import pytest

from sage.stages.score import REWARD_VERSION, score_id
from sage.warehouse import Warehouse
from sage.warehouse.db import migrations
from sage.warehouse.queries import training_rows

pytestmark = pytest.mark.fast


def _rollout(rid: str) -> dict:
    return {"rollout_id": rid, "run_id": "r", "iteration": 1, "stage": "challenge", "role": "challenger",
            "purpose": "challenge", "question_id": "q", "template": "v1", "prompt_text": "p", "completion_text": "c",
            "prompt_ids": [1, 2], "completion_ids": [3], "sample_index": 0, "seed": 0, "format_reward": 1.0}


def _score(rid: str, version: int, reward: float, advantage: float) -> dict:
    return {"score_id": score_id(rid, version), "rollout_id": rid, "reward_version": version, "run_id": "r",
            "iteration": 1, "role": "challenger", "reward": reward, "components": {"v": version},
            "group_key": "challenger", "advantage": advantage}


def test_migration_gives_old_rows_version_1_and_their_id(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb", migrate=False) as wh:
        wh.execute("CREATE TABLE migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
                   " applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)")
        for version, name, sql in migrations():
            if name == "score_versions":
                break
            wh.execute(sql)
            wh.execute("INSERT INTO migrations (version, name) VALUES (?, ?)", [version, name])
        wh.insert_batch("rollouts", [_rollout("a")])
        wh.insert_batch("scores", [{"rollout_id": "a", "run_id": "r", "iteration": 1, "role": "challenger",
                                    "reward": 0.8, "components": {}, "group_key": "challenger", "advantage": 0.5}])
        assert wh.migrate()  # the rest, this one included
        row = wh.rows("SELECT score_id, reward_version, reward FROM scores")[0]
        assert row == {"score_id": score_id("a", 1), "reward_version": 1, "reward": 0.8}


def test_rescore_adds_rows_and_readers_take_the_current_version(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        wh.insert_batch("rollouts", [_rollout("a"), _rollout("b")])
        assert wh.insert_batch("scores", [_score("a", 1, 0.8, 1.0), _score("b", 1, 0.4, -1.0)]) == 2
        assert wh.insert_batch("scores", [_score("a", REWARD_VERSION, 0.5, -1.0),
                                          _score("b", REWARD_VERSION, 0.6, 1.0)]) == 2
        assert wh.insert_batch("scores", [_score("a", REWARD_VERSION, 0.5, -1.0)]) == 0   # same version: no-op
        assert wh.count("scores") == 4
        rows = training_rows(wh, "r", 1, REWARD_VERSION)
        assert [(r["rollout_id"], r["advantage"]) for r in rows] == [("a", -1.0), ("b", 1.0)]
        view = wh.rows("SELECT reward_version, rollouts, mean_reward FROM role_rewards WHERE run_id = 'r'")
        assert view == [{"reward_version": REWARD_VERSION, "rollouts": 2, "mean_reward": 0.55}]
