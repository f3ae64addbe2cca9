"""The stage_runs contract in flows/record.py: what a finished stage leaves behind."""

from pathlib import Path

import pytest

from sage.configs import load_config
from sage.flows.record import run_recorded
from sage.stages.context import StageContext, StageReport
from sage.warehouse import Warehouse

pytestmark = pytest.mark.fast


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


def test_a_signal_swallowed_by_a_finaliser_still_stops_the_stage_at_its_next_batch(tmp_path):
    """A signal handler's exception raised while Python runs a `__del__` is ignored ("Exception ignored in"),
    and Prefect's flow engine installs its own SIGTERM handler that records nothing: the command's handler is put
    back inside every flow, records the signal, and the stage stops at the next batch it reports; the swallowed
    exception prints nothing (other unraisable exceptions still reach the hook)."""
    import gc
    import os
    import signal
    import sys

    from prefect.utilities.engine import capture_sigterm

    from sage.flows.record import Interrupted, on_signal, quiet_swallowed
    from sage.flows.session import Session, opened

    class Finaliser:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between these bytecodes, inside the finaliser
                pass

    previous, hook, unraisable = signal.signal(signal.SIGTERM, on_signal), sys.unraisablehook, []
    on_signal.armed, sys.unraisablehook = True, quiet_swallowed(unraisable.append)
    batches = []
    try:
        with capture_sigterm():  # what Prefect does around a flow run
            assert signal.getsignal(signal.SIGTERM) is not on_signal
            with Session(tmp_path) as s, opened(tmp_path):
                assert signal.getsignal(signal.SIGTERM) is on_signal  # the command's handler is back
                ctx = s.context_for(load_config("cpu", [f"run.dir={tmp_path}"]), None)

                def stage(ctx) -> StageReport:
                    for batch in range(3):
                        if batch == 1:
                            Finaliser()
                            gc.collect()
                        ctx.report("seed", batch + 1, 3)
                        batches.append(batch)
                    return StageReport("seed", rows_in=3, rows_out=3)

                with pytest.raises(Interrupted):
                    run_recorded(ctx, "seed", stage, run_id="r", iteration=0)
                assert batches == [0]  # the batch in flight when the signal came was the last
                assert s.warehouse.scalar("SELECT status FROM stage_runs WHERE run_id = 'r'") == "interrupted"
        assert unraisable == []
        Interrupted.received = None

        class Broken:
            def __del__(self):
                raise ValueError("not a signal")

        Broken()
        gc.collect()
        assert [type(u.exc_value) for u in unraisable] == [ValueError]
    finally:
        Interrupted.received, on_signal.armed, sys.unraisablehook = None, False, hook
        signal.signal(signal.SIGTERM, previous)
