"""Pool sampling in SQL: `sample_pool` draws k distinct questions of the run's pool (seeds plus questions
admitted up to the iteration, of the asked domains), the same ones for the same key, and each pool question
about equally often over many keys."""

from __future__ import annotations

from collections import Counter

from sage.warehouse import Warehouse, norm_hash
from sage.warehouse.queries import sample_pool


def _warehouse(tmp_path) -> Warehouse:
    wh = Warehouse.open(tmp_path / "w.duckdb")
    rows = [dict(question_id=f"s{i}", origin="seed", domain="math" if i % 2 else "code", text=f"seed {i}",
                 verifier={"answer": "1"}, norm_hash=norm_hash(f"seed {i}")) for i in range(10)]
    rows += [dict(question_id=f"g{i}", origin="generated", domain="math", text=f"gen {i}", verifier={"answer": "2"},
                  norm_hash=norm_hash(f"gen {i}"), run_id="r" if i < 6 else "other", iteration=1 + i % 3,
                  admitted=i % 2 == 0, admitted_iteration=1 + i % 3 if i % 2 == 0 else None) for i in range(8)]
    wh.insert_batch("questions", rows)
    return wh


def test_draws_only_the_pool_the_same_for_the_same_key(tmp_path):
    wh = _warehouse(tmp_path)
    # run r's pool at iteration 2, math: seeds s1 s3 s5 s7 s9, g0 (admitted at 1); g2 admitted at 3, g4 at 2
    pool = {"s1", "s3", "s5", "s7", "s9", "g0", "g4"}
    drawn = sample_pool(wh, "r", 2, ["math"], 5, "k1")
    assert len(drawn) == 5 and len({q["question_id"] for q in drawn}) == 5
    assert {q["question_id"] for q in drawn} <= pool
    assert drawn == sample_pool(wh, "r", 2, ["math"], 5, "k1")
    assert all(q["verifier"] in ({"answer": "1"}, {"answer": "2"}) for q in drawn)   # rows decoded
    assert {q["question_id"] for q in sample_pool(wh, "r", 2, ["math"], 50, "k1")} == pool  # k above the pool: all
    assert sample_pool(wh, "r", 2, ["math"], 5, "k2") != drawn
    wh.close()


def test_every_pool_question_is_drawn_about_equally_often(tmp_path):
    wh = _warehouse(tmp_path)
    counts = Counter(q["question_id"] for key in range(700) for q in sample_pool(wh, "r", 2, ["math"], 2, str(key)))
    assert set(counts) == {"s1", "s3", "s5", "s7", "s9", "g0", "g4"}
    assert all(150 <= c <= 250 for c in counts.values()), counts   # 700 * 2 / 7 = 200 each
    wh.close()


def test_a_generated_share_draws_the_newest_admitted_questions_first_and_the_pool_fills_the_rest(tmp_path):
    wh = _warehouse(tmp_path)
    # run r's admitted math questions by iteration 3: g0 (admitted at 1), g4 (2), g2 (3)
    drawn = [q["question_id"] for q in sample_pool(wh, "r", 3, ["math"], 4, "k1", generated=2)]
    assert drawn[:2] == ["g2", "g4"] and len(set(drawn)) == 4
    assert set(drawn[2:]) <= {"s1", "s3", "s5", "s7", "s9", "g0"}
    assert drawn == [q["question_id"] for q in sample_pool(wh, "r", 3, ["math"], 4, "k1", generated=2)]
    # more asked than admitted: every admitted one, then the seeds; at most k in all
    short = [q["question_id"] for q in sample_pool(wh, "r", 3, ["math"], 5, "k1", generated=5)]
    assert short[:3] == ["g2", "g4", "g0"] and len(short) == 5 and all(i.startswith("s") for i in short[3:])
    assert len(sample_pool(wh, "r", 3, ["math"], 2, "k1", generated=5)) == 2
    assert {q["origin"] for q in sample_pool(wh, "r", 3, ["math"], 2, "k1", generated=2)} == {"generated"}
    # without a share the draw is the uniform one, as before the setting existed
    assert sample_pool(wh, "r", 3, ["math"], 4, "k1", generated=0) == sample_pool(wh, "r", 3, ["math"], 4, "k1")
    wh.close()
