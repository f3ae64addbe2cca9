"""The stage_runs contract in flows/record.py: what a finished stage leaves behind."""

from pathlib import Path

from sage.configs import load_config
from sage.flows.record import run_recorded
from sage.stages.context import StageContext, StageReport
from sage.warehouse import Warehouse


def test_a_finished_stage_is_checkpointed_into_the_file(tmp_path):
    """At the end of every stage the write-ahead log is folded into the database file, so a damaged log can
    only cost what came after the last finished stage."""
    path = tmp_path / "warehouse.duckdb"
    wal = Path(f"{path}.wal")
    with Warehouse.open(path) as wh:
        ctx = StageContext(cfg=load_config("cpu", [f"run.dir={tmp_path}"]), wh=wh)

        def stage(ctx) -> StageReport:
            rows = [dict(question_id=f"q{i}", origin="seed", domain="math", text=f"{i}?", verifier={"answer": "1"},
                         norm_hash=f"h{i}") for i in range(500)]
            return StageReport("seed", rows_in=500, rows_out=ctx.wh.insert_batch("questions", rows))

        wh.checkpoint()
        assert not wal.exists() or wal.stat().st_size == 0
        report = run_recorded(ctx, "seed", stage, run_id="r", iteration=0)
        assert report.rows_out == 500
        assert not wal.exists() or wal.stat().st_size == 0  # nothing of the stage is left only in the log
        assert wh.scalar("SELECT status FROM stage_runs WHERE run_id = 'r'") == "done"
