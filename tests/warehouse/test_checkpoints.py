"""One resolver for checkpoint names (eval, export, serve): base, best, latest, N; the base model is a
checkpoint like any other."""

import pytest

from sage.warehouse import Warehouse
from sage.warehouse.checkpoints import Checkpoint, CheckpointNotFound, resolve_checkpoint

pytestmark = pytest.mark.fast


def test_checkpoint_names_resolve_from_the_checkpoints_table(tmp_path):
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        with pytest.raises(ValueError, match="no checkpoints yet"):
            resolve_checkpoint(wh, "r1", "latest")
        wh.insert_batch("checkpoints", [dict(run_id="r1", iteration=i, adapter_path=f"/a/{i}", is_best=i == 2)
                                        for i in (1, 2, 3)])
        assert resolve_checkpoint(wh, "r1", "base") == Checkpoint("base", 0, None)
        best = resolve_checkpoint(wh, "r1", "best")
        assert (best.adapter, best.iteration, best.stored, best.label) == ("/a/2", 2, "/a/2", "best (iteration 2)")
        assert resolve_checkpoint(wh, "r1", "latest").adapter == "/a/3"
        assert resolve_checkpoint(wh, "r1", "1").adapter == "/a/1"
        with pytest.raises(ValueError, match=r"iterations \[1, 2, 3\]"):
            resolve_checkpoint(wh, "r1", "7")
        with pytest.raises(ValueError, match="--run"):
            resolve_checkpoint(wh, None, "best")
        with pytest.raises(CheckpointNotFound, match="use 'best', 'latest' or an iteration"):
            resolve_checkpoint(wh, "r1", "newest")


def test_the_base_model_is_a_checkpoint(tmp_path):
    """A run whose best is iteration 0 (validation never beat the base model): best, latest and 0 all name
    the base model, with no adapter, whatever name it is reached by."""
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        wh.insert_batch("checkpoints", [dict(run_id="r", iteration=0, adapter_path="base", val_accuracy=0.25,
                                             is_best=True)])
        for name in ("best", "latest", "0", "base"):
            c = resolve_checkpoint(wh, "r", name)
            assert (c.iteration, c.adapter, c.stored, c.val_accuracy) == (0, None, "base", 0.25), name
        assert resolve_checkpoint(wh, None, "base") == Checkpoint("base", 0, None)


def test_iteration_summary_has_a_training_table_only_where_the_iteration_trained(tmp_path):
    """A checkpoint row without training metrics (`train.enabled` false, or validation's row for the base model)
    gives no training table, rather than one of empty cells."""
    from sage.warehouse.queries import iteration_summary

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        wh.insert_batch("checkpoints", [dict(run_id="r", iteration=1, adapter_path="base"),
                                        dict(run_id="r", iteration=2, adapter_path="/a/2",
                                             metrics={"n_rows": 96, "n_updates": 12, "loss": 0.13})])
        assert iteration_summary(wh, "r", 1)["training"] == []
        (row,) = iteration_summary(wh, "r", 2)["training"]
        assert (row["rows"], row["updates"], row["loss"]) == (96, 12, 0.13)
