"""The filter on hand-made questions: validity, alpha, duplicates, contamination by validation or benchmark
text, and MinHash near-duplicates (measured always, rejected when the threshold says so)."""

from __future__ import annotations

import pytest

from sage.configs import load_config
from sage.stages import admit
from sage.stages.context import StageContext
from sage.warehouse import Warehouse, content_id, norm_hash

pytestmark = pytest.mark.fast

SEED = "What is the greatest common divisor of 12 and 18?"
VALIDATION = "What is the least common multiple of 4 and 6?"
BENCH = "Find the sum of all positive divisors of 36."
NEW = {  # text, s_q, verifier valid
    "ok": ("A train travels 60 km in 1.5 hours. What is its average speed in km per hour?", 0.9, True),
    "copy_val": ("what is the LEAST common multiple of 4 and 6", 0.9, True),       # normalises to VALIDATION
    "copy_bench": ("Find the sum of all positive divisors of 36!", 0.3, False),   # contaminated beats the rest
    "low": ("Compute 7 times 8 and then subtract 5 from the result.", 0.5, True),
    "invalid": ("Write a function that reverses a list of integers.", 0.9, False),
    "dup_seed": ("What is the greatest common divisor of 12 and 18 ?", 0.8, True),
    "near_seed": ("What is the greatest common divisor of 12 and 20?", 0.8, True),
}


@pytest.fixture
def setup(tmp_path):
    def make(*extra: str):
        cfg = load_config("cpu", [f"run.dir={tmp_path}", *extra])
        wh = Warehouse.open(tmp_path / f"w{len(list(tmp_path.glob('*.duckdb')))}.duckdb")
        rows = [dict(question_id="seed", origin="seed", domain="math", text=SEED, verifier={"answer": "6"},
                     norm_hash=norm_hash(SEED)),
                dict(question_id="val", origin="validation", domain="math", text=VALIDATION,
                     verifier={"answer": "12"}, norm_hash=norm_hash(VALIDATION)),
                dict(question_id="bench", origin="benchmark", domain="math", text=BENCH, verifier={"answer": "91"},
                     norm_hash=norm_hash(BENCH))]
        rows += [dict(question_id=name, origin="generated", domain="math", text=t, verifier={"answer": "1"},
                      norm_hash=norm_hash(t), run_id="r", iteration=1, s_q=s_q, verifier_valid=valid,
                      rollout_id=content_id("rollout", name))
                 for name, (t, s_q, valid) in NEW.items()]
        wh.insert_batch("questions", rows)
        wh.insert_batch("iterations", [dict(run_id="r", iteration=1)])
        return StageContext(cfg=cfg, wh=wh, run_id="r", iteration=1), wh
    return make


def _decided(wh) -> dict[str, dict]:
    return {r["question_id"]: r for r in wh.rows(
        "SELECT question_id, admitted, rejection_reason, near_dup_similarity, near_dup_of FROM questions "
        "WHERE origin = 'generated'")}


def test_contaminated_rejected_and_near_duplicates_measured(setup):
    ctx, wh = setup()                                   # near_duplicate_threshold None: measured only
    report = admit.run(ctx)
    got = _decided(wh)
    assert {k: v["rejection_reason"] for k, v in got.items()} == {
        "ok": None, "copy_val": "contaminated", "copy_bench": "contaminated", "low": "low_quality",
        "invalid": "invalid_verifier", "dup_seed": "duplicate", "near_seed": None}
    assert report.info == {"admitted": 2, "rejected": 5, "contaminated": 2, "low_quality": 1,
                           "invalid_verifier": 1, "duplicate": 1}
    assert got["copy_val"]["near_dup_of"] == "val" and got["copy_val"]["near_dup_similarity"] == 1.0
    assert got["dup_seed"]["near_dup_of"] == "seed" and got["dup_seed"]["near_dup_similarity"] == 1.0
    # "... divisor of 12 and 20?" shares 7 of its 8 word trigrams with the seed: Jaccard 7/9 = 0.78
    assert got["near_seed"]["near_dup_of"] == "seed"
    assert got["near_seed"]["near_dup_similarity"] == pytest.approx(7 / 9, abs=0.12)
    assert got["ok"]["near_dup_similarity"] < 0.2
    drift = wh.rows("SELECT admitted, rejected, rejected_contaminated, rejected_near_duplicate, rejected_duplicate, "
                    "max_near_dup_similarity FROM curriculum_drift WHERE run_id = 'r' AND iteration = 1")[0]
    assert drift == {"admitted": 2, "rejected": 5, "rejected_contaminated": 2, "rejected_near_duplicate": 0,
                     "rejected_duplicate": 1, "max_near_dup_similarity": 1.0}
    before = wh.rows("SELECT * FROM questions ORDER BY question_id")
    assert admit.run(ctx).rows_in == 0 and wh.rows("SELECT * FROM questions ORDER BY question_id") == before


def test_near_duplicate_rejected_at_the_threshold(setup):
    ctx, wh = setup("iteration.near_duplicate_threshold=0.6")
    admit.run(ctx)
    got = _decided(wh)
    assert got["near_seed"]["rejection_reason"] == "near_duplicate" and got["ok"]["admitted"]
    assert wh.scalar("SELECT rejected_near_duplicate FROM curriculum_drift WHERE run_id = 'r'") == 1


def test_decide_order():
    q = {"norm_hash": "h", "verifier_valid": True, "s_q": 0.9}
    assert admit.decide(q, 0.7, set()) is None
    assert admit.decide(q, 0.7, set(), frozenset({"h"})) == "contaminated"
    assert admit.decide(q, 0.7, {"h"}, similarity=1.0, threshold=0.5) == "duplicate"
    assert admit.decide(q, 0.7, set(), similarity=0.5, threshold=0.5) == "near_duplicate"
    assert admit.decide(q, 0.7, set(), similarity=0.49, threshold=0.5) is None
