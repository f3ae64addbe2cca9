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
    # near_duplicate_threshold None: measured only; alpha 0.7 (the paper's; cpu.yaml lowers it)
    ctx, wh = setup("iteration.near_duplicate_threshold=null", "iteration.alpha=0.7")
    report = admit.run(ctx)
    got = _decided(wh)
    assert {k: v["rejection_reason"] for k, v in got.items()} == {
        "ok": None, "copy_val": "contaminated", "copy_bench": "contaminated", "low": "low_quality",
        "invalid": "invalid_verifier", "dup_seed": "duplicate", "near_seed": None}
    assert report.info == {"admitted": 2, "rejected": 5, "contaminated": 2, "low_quality": 1,
                           "invalid_verifier": 1, "duplicate": 1, "novel_structures": 0}
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
    ctx, wh = setup("iteration.near_duplicate_threshold=0.6", "iteration.alpha=0.7")
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



def test_the_default_threshold_rejects_near_duplicates():
    assert load_config("cpu").iteration.near_duplicate_threshold == 0.8


def _generated(name: str, text: str, s_q: float = 0.9, valid: bool = True, domain: str = "math",
               verifier: dict | None = None) -> dict:
    return dict(question_id=name, origin="generated", domain=domain, text=text,
                verifier=verifier if verifier is not None else {"answer": "1", "label": "grounded"},
                norm_hash=norm_hash(text), run_id="r", iteration=1, s_q=s_q, verifier_valid=valid,
                rollout_id=content_id("rollout", name))


def _admit(tmp_path, rows: list[dict], *overrides: str):
    cfg = load_config("cpu", [f"run.dir={tmp_path}", "iteration.alpha=0.7", *overrides])
    wh = Warehouse.open(":memory:")
    wh.insert_batch("questions", [dict(question_id="seed", origin="seed", domain="math", text=SEED,
                                       verifier={"answer": "6"}, norm_hash=norm_hash(SEED)),
                                  dict(question_id="val", origin="validation", domain="math", text=VALIDATION,
                                       verifier={"answer": "12"}, norm_hash=norm_hash(VALIDATION))] + rows)
    wh.insert_batch("iterations", [dict(run_id="r", iteration=1)])
    report = admit.run(StageContext(cfg=cfg, wh=wh, run_id="r", iteration=1))
    return wh, report


_TEXTS = ["A shop sells 14 pens a day. How many pens does it sell in a week?",
          "Divide 9 cakes equally among 3 plates; how many per plate?",
          "Tom has 5 marbles and buys 8 more. How many marbles now?",
          "A rectangle is 6 cm by 11 cm. What is its area in square cm?",
          "How many wheels do 13 bicycles have altogether on the road?",
          "A bus carries 31 people and 12 get off at the first stop. How many remain?",
          "A baker bakes 48 rolls and sells 19 of them by noon. How many are left for the afternoon?"]
# each reason the challenge stage gives a math label that is not grounded (tests/stages/test_challenge.py checks
# the stage writes exactly these)
UNGROUNDED = dict(zip(sorted(admit.LABEL_FAILURES), _TEXTS))


def test_an_ungrounded_math_label_keeps_its_reason(tmp_path):
    rows = [_generated(label, text, valid=False, verifier={"answer": "1", "label": label})
            for label, text in UNGROUNDED.items()]
    rows += [_generated("code_invalid", "Write a function that sorts a list of words by length.", valid=False,
                        domain="code", verifier={"entry_point": "f", "inputs": [], "outputs": None}),
             _generated("no_label", "A farmer plants 21 rows of 17 trees. How many trees?", valid=False,
                        verifier={"answer": "x"}),
             _generated("odd_label", "What is the product of 23 and 29 exactly?", valid=False,
                        verifier={"answer": "1", "label": "answer_only"}),
             # a code question whose verifier happened to carry a label name: code keeps invalid_verifier
             _generated("code_label", "Write a function that reverses the words of a sentence.", valid=False,
                        domain="code", verifier={"label": "no_program"})]
    wh, report = _admit(tmp_path, rows)
    got = {k: v["rejection_reason"] for k, v in _decided(wh).items()}
    assert got == {**{label: label for label in UNGROUNDED}, "code_invalid": "invalid_verifier",
                   "no_label": "invalid_verifier", "odd_label": "invalid_verifier", "code_label": "invalid_verifier"}
    assert set(UNGROUNDED) == admit.LABEL_FAILURES and len(UNGROUNDED) == len(admit.LABEL_FAILURES)
    n = len(UNGROUNDED)
    assert report.info == {"admitted": 0, "rejected": n + 4, "invalid_verifier": 4,
                           **{label: 1 for label in UNGROUNDED}, "novel_structures": 0}
    drift = wh.rows("SELECT rejected, rejected_invalid_verifier, rejected_ungrounded FROM curriculum_drift "
                    "WHERE run_id = 'r' AND iteration = 1")
    assert drift == [{"rejected": n + 4, "rejected_invalid_verifier": 4, "rejected_ungrounded": n}]


def test_an_ungrounded_label_is_rejected_before_quality_and_duplicates(tmp_path):
    # contaminated still beats it; the label's reason beats low quality and duplication
    rows = [_generated("low", "A tank holds 40 litres and leaks 3 litres an hour. When is it empty?", s_q=0.1,
                       valid=False, verifier={"answer": "1", "label": "label_mismatch"}),
            _generated("dup", SEED, valid=False, verifier={"answer": "1", "label": "program_failed"}),
            _generated("copy_val", VALIDATION, valid=False, verifier={"answer": "1", "label": "no_program"})]
    wh, _ = _admit(tmp_path, rows)
    assert {k: v["rejection_reason"] for k, v in _decided(wh).items()} == {"low": "label_mismatch",
                                                                           "dup": "program_failed",
                                                                           "copy_val": "contaminated"}


COPY = "Sara has 17 red beads and 25 blue beads in a jar. How many beads are in the jar?"


def test_a_batch_of_copies_admits_at_most_one(tmp_path):
    variants = [COPY, COPY.replace("jar?", "jar ?"), COPY.replace("Sara", "Sarah"), COPY.replace("Sara", "Ann"),
                COPY, COPY.lower()]
    rows = [_generated(f"c{k}", text) for k, text in enumerate(variants)]
    rows.append(_generated("other", "A train travels 60 km in 1.5 hours. What is its speed in km per hour?"))
    wh, report = _admit(tmp_path, rows)
    got = _decided(wh)
    assert [got[f"c{k}"]["admitted"] for k in range(len(variants))] == [True] + [False] * (len(variants) - 1)
    assert got["other"]["admitted"]
    for k in range(1, len(variants)):
        assert got[f"c{k}"]["rejection_reason"] in ("duplicate", "near_duplicate"), k
        assert got[f"c{k}"]["near_dup_similarity"] >= 0.8 and got[f"c{k}"]["near_dup_of"].startswith("c"), k
    assert got["c3"]["rejection_reason"] == "near_duplicate"        # another name, the same puzzle
    assert got["c4"]["rejection_reason"] == "duplicate"             # the same text as the admitted one
    assert report.info["admitted"] == 2
    share = wh.scalar("SELECT copy_share FROM curriculum_drift WHERE run_id = 'r' AND iteration = 1")
    assert share == pytest.approx(5 / 7)


def test_a_copy_of_an_earlier_rejected_question_is_a_near_duplicate(tmp_path):
    # c0 is written first and rejected (low quality); its copies are copies all the same, and the best-rated
    # of them is not admitted in its place
    rows = [_generated("c0", COPY, s_q=0.2), _generated("c1", COPY, s_q=0.9),
            _generated("c2", COPY.replace("Sara", "Mia"), s_q=1.0)]
    wh, _ = _admit(tmp_path, rows)
    got = _decided(wh)
    assert [(got[q]["admitted"], got[q]["rejection_reason"]) for q in ("c0", "c1", "c2")] == [
        (False, "low_quality"), (False, "near_duplicate"), (False, "near_duplicate")]
    assert got["c1"]["near_dup_of"] == "c0" and got["c1"]["near_dup_similarity"] == 1.0
    assert got["c2"]["near_dup_of"] in ("c0", "c1")


def test_copies_are_decided_in_id_order_on_every_run(tmp_path):
    rows = [_generated("b", COPY), _generated("a", COPY.replace("Sara", "Ann"))]
    first, _ = _admit(tmp_path, rows)
    again, _ = _admit(tmp_path, list(reversed(rows)))
    assert _decided(first) == _decided(again)
    assert _decided(first)["a"]["admitted"] and _decided(first)["b"]["rejection_reason"] == "near_duplicate"


def test_without_a_threshold_copies_are_measured_not_rejected(tmp_path):
    rows = [_generated("c0", COPY), _generated("c1", COPY.replace("Sara", "Ann"))]
    wh, _ = _admit(tmp_path, rows, "iteration.near_duplicate_threshold=null")
    got = _decided(wh)
    assert got["c0"]["admitted"] and got["c1"]["admitted"]
    assert got["c1"]["near_dup_of"] == "c0" and got["c1"]["near_dup_similarity"] >= 0.8


def test_the_same_problem_in_other_words_is_a_duplicate_or_contaminated(tmp_path):
    """Lever 15's audit found nine admitted questions restating an earlier one in other words, three of them
    validation problems: text similarity cannot see it, the question's own arithmetic can. Code questions have
    no such key."""
    seed, val = "Determine the value of l that satisfies: l + 8 = 15", "State the final answer to the problem: 5 - 1 ="
    rows = [_generated("a_val", "Solve the following arithmetic problem: 5 - 1"),
            _generated("b_seed", "What is the value of q when q + 8 = 15?"),
            _generated("c_first", "What is 12 + 10?"),
            _generated("d_again", "Calculate 12 + 10."),
            _generated("e_new", "Find the value of x that satisfies: x + 4 = 11"),
            _generated("f_code", "Write a function that returns 12 + 10.", domain="code"),
            dict(question_id="seed2", origin="seed", domain="math", text=seed, verifier={"answer": "7"},
                 norm_hash=norm_hash(seed)),
            dict(question_id="val2", origin="validation", domain="math", text=val, verifier={"answer": "4"},
                 norm_hash=norm_hash(val))]
    wh, _ = _admit(tmp_path, rows)
    assert {k: v["rejection_reason"] for k, v in _decided(wh).items()} == {
        "a_val": "contaminated", "b_seed": "duplicate", "c_first": None, "d_again": "duplicate", "e_new": None,
        "f_code": None}


FRONTIER = {  # question: probe pass rate p (1 - difficulty); None: never probed
    "p0": 0.0, "p25": 0.25, "p30": 0.3, "p50": 0.5, "p70": 0.7, "p75": 0.75, "p100": 1.0, "unprobed": None}
_WORDS = ["apples", "boats", "coins", "drums", "eggs", "flags", "grapes", "hats"]


def _probed(name: str, p: float | None, k: int) -> dict:
    row = _generated(name, f"A crate holds {k + 3} {_WORDS[k]} and {k + 11} more arrive. How many {_WORDS[k]}?")
    return {**row, "difficulty": None if p is None else 1.0 - p}


@pytest.mark.parametrize("rule, admitted, reasons", [
    ("quality", set(FRONTIER), {}),
    ("solvable", {"p25", "p30", "p50", "p70", "p75"}, {"p0": "too_hard", "p100": "too_easy", "unprobed": "unprobed"}),
    ("band", {"p30", "p50", "p70"}, {"p0": "too_hard", "p25": "too_hard", "p75": "too_easy", "p100": "too_easy",
                                     "unprobed": "unprobed"}),
])
def test_admission_rules_on_the_probe_pass_rate(tmp_path, rule, admitted, reasons):
    """`iteration.admission`: quality (the default) admits any pass rate; solvable (AZR) 0 < p < 1; band (R-Zero)
    band_low <= p <= band_high, the edges included. The admit line gives the admitted questions' mean p."""
    rows = [_probed(name, p, k) for k, (name, p) in enumerate(FRONTIER.items())]
    wh, report = _admit(tmp_path, rows, f"iteration.admission={rule}")
    got = _decided(wh)
    assert {k for k, v in got.items() if v["admitted"]} == admitted
    assert {k: v["rejection_reason"] for k, v in got.items() if not v["admitted"]} == reasons
    rates = [FRONTIER[k] for k in admitted if FRONTIER[k] is not None]
    assert report.info["mean_pass_rate"] == round(sum(rates) / len(rates), 3)
    # the view: every probed question's p beside the run's rule and band (no `runs` row here: the defaults)
    view = {r["question_id"]: r for r in wh.rows("SELECT * FROM admission_frontier")}
    assert view == {} or set(view) <= set(FRONTIER)


def test_a_narrower_band_and_a_band_out_of_order(tmp_path):
    rows = [_probed(name, p, k) for k, (name, p) in enumerate(FRONTIER.items())]
    wh, _ = _admit(tmp_path, rows, "iteration.admission=band", "iteration.band_low=0.5", "iteration.band_high=0.5")
    assert {k for k, v in _decided(wh).items() if v["admitted"]} == {"p50"}
    with pytest.raises(ValueError, match="band_low .* is above iteration.band_high"):
        load_config("cpu", ["iteration.band_low=0.8", "iteration.band_high=0.2"])


def test_batch_repetition_is_the_share_of_the_batch_a_question_repeats(tmp_path):
    """Three rewordings of one question and one other: each of the three repeats three of the four written
    (R-Zero's |cluster| / batch at rewards.repetition_similarity 0.5), the other only itself; an unparseable
    question (no text) is outside the batch."""
    rows = [_generated("a", COPY), _generated("b", COPY.replace("Sara", "Sarah")),
            _generated("c", COPY.replace("jar?", "box?")), _generated("d", _TEXTS[0]),
            {**_generated("e", ""), "text": "", "verifier_valid": False}]
    wh, _ = _admit(tmp_path, rows, "iteration.near_duplicate_threshold=null")
    got = dict(wh.execute("SELECT question_id, batch_repetition FROM questions WHERE origin = 'generated'"))
    assert got == {"a": 0.75, "b": 0.75, "c": 0.75, "d": 0.25, "e": None}


def test_a_test_problem_is_guarded_like_validation_and_a_leak_into_the_pool_is_reported(tmp_path):
    """Test problems (origin `test`, `seeds.heldout`): a generated copy in other words is `contaminated`; a seed that
    asks a test problem's sum is a leak the admit line counts (`test_in_pool`) and `heldout_leaks` lists, beside a
    seed that copies a validation problem's text; admit stores the content keys it compares."""
    test_q = dict(question_id="t1", origin="test", domain="math", text="State the answer: 7 + 5 =",
                  verifier={"answer": "12"}, norm_hash=norm_hash("State the answer: 7 + 5 ="))
    leak = dict(question_id="seed_leak", origin="seed", domain="math", text="What is 7 + 5?", verifier={"answer": "12"},
                norm_hash=norm_hash("What is 7 + 5?"))
    copy_val = dict(question_id="seed_val", origin="seed", domain="math", text=VALIDATION.upper(),
                    verifier={"answer": "12"}, norm_hash=norm_hash(VALIDATION))
    rows = [test_q, leak, copy_val, _generated("copy_test", "Compute 7 + 5."), _generated("fine", _TEXTS[1])]
    wh, report = _admit(tmp_path, rows)
    assert {k: v["rejection_reason"] for k, v in _decided(wh).items()} == {"copy_test": "contaminated", "fine": None}
    assert report.info["test_in_pool"] == 1 and report.info["contaminated"] == 1
    keys = dict(wh.execute("SELECT question_id, content_key FROM questions"))
    assert keys["t1"] == keys["seed_leak"] == keys["copy_test"] == "7+5" and keys["fine"] is None
    wh.insert_batch("runs", [{"run_id": "r", "config": {}, "config_hash": "h", "base_model": "m", "seed": 0}])
    leaks = wh.rows("SELECT question_id, origin, heldout_id, heldout_origin, matched_by FROM heldout_leaks")
    assert leaks == [
        {"question_id": "seed_leak", "origin": "seed", "heldout_id": "t1", "heldout_origin": "test",
         "matched_by": "content"},
        {"question_id": "seed_val", "origin": "seed", "heldout_id": "val", "heldout_origin": "validation",
         "matched_by": "text"}]
    # without test problems the line has no such count
    _, plain = _admit(tmp_path, [_generated("fine", _TEXTS[1])])
    assert "test_in_pool" not in plain.info


def _program(name: str, text: str, program: str) -> dict:
    return _generated(name, text, verifier={"answer": "1", "label": "grounded", "program": program})


def test_admit_stores_structures_and_counts_those_no_seed_has(tmp_path):
    """The structure of each decided math question (its program's, else its text's) and of each seed is stored;
    the line and `curriculum_structures` count admitted questions of a structure no seed has: the seed asks a GCD
    of two numbers, so a GCD of a product is new, a GCD of two other numbers (program or text) is not."""
    rows = [_program("gcd_of_product", "Find the GCD of 12 * 4 and 18.",
                     "import math\ndef solve():\n    return math.gcd(12 * 4, 18)"),
            _program("gcd_again", "What is the greatest common divisor of 21 and 14?",
                     "import math\ndef solve():\n    return math.gcd(21, 14)"),
            _generated("text_only", "Find the highest common factor of 8 and 20."),
            _program("rejected_new", "Compute 3 * 4 + 5.", "def solve():\n    return 3 * 4 + 5") | {"s_q": 0.1},
            _generated("word", _TEXTS[2]),
            _generated("code", "Write a function that adds two numbers.", domain="code",
                       verifier={"entry_point": "f", "inputs": [[1, 2]], "outputs": ["3"]})]
    wh, report = _admit(tmp_path, rows)
    got = dict(wh.execute("SELECT question_id, structure FROM questions"))
    assert got == {"seed": "gcd(n,n)", "val": None, "gcd_of_product": "gcd(mul(n,n),n)", "gcd_again": "gcd(n,n)",
                   "text_only": "gcd(n,n)", "rejected_new": "add(mul(n,n),n)", "word": None, "code": None}
    assert report.info["novel_structures"] == 1 and report.info["admitted"] == 5
    row = wh.rows("SELECT * FROM curriculum_structures")
    assert len(row) == 1 and row[0]["trigram_novelty_vs_seeds"] > 0
    assert {k: v for k, v in row[0].items() if k != "trigram_novelty_vs_seeds"} == {
        "run_id": "r", "iteration": 1, "admitted": 5, "with_structure": 3, "structures": 2, "novel_structures": 1,
        "novel_share": 0.2}
