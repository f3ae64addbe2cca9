"""The order of an iteration's stages is written once (`ITERATION_STAGES`, configs/names.py): the flow runs
them in it, a redo marks the ones after it stale, `sage status` lists them in it, and every stage a redo can
replace names the rows it forgets."""

from __future__ import annotations

import pytest

from sage.configs.names import ITERATION_STAGES, Stage
from sage.flows import iteration
from sage.warehouse import Warehouse, redo
from sage.warehouse.queries import stage_states

pytestmark = pytest.mark.fast


def test_the_enum_the_flow_and_the_redo_order_follow_one_tuple():
    assert tuple(Stage) == (Stage.SEED, *ITERATION_STAGES, Stage.VALIDATE)
    assert iteration.STAGE_NAMES == ITERATION_STAGES
    assert set(iteration._RUNS) == set(ITERATION_STAGES)   # no stage function left out of the order
    assert redo.ORDER == (*ITERATION_STAGES, Stage.VALIDATE)
    assert set(redo._FORGET) == set(redo.ORDER)             # each stage names the rows its redo replaces


def test_status_lists_a_redone_stage_in_its_place():
    with Warehouse.open(":memory:") as wh:
        for stage, started in [("seed", "01:00"), ("score", "01:01"), ("train", "01:02"), ("challenge", "01:03"),
                               ("validate", "00:59")]:
            wh.execute("INSERT INTO stage_runs (run_id, iteration, stage, status, started_at) "
                       "VALUES ('r', ?, ?, 'done', ?)", [0 if stage == "seed" else 1, stage, f"2026-01-01 {started}"])
        assert [(r["iteration"], r["stage"]) for r in stage_states(wh, "r")] == [
            (0, "seed"), (1, "challenge"), (1, "score"), (1, "train"), (1, "validate")]
