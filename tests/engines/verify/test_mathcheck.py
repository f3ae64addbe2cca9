"""Math checker: a table of equivalent / not-equivalent answer pairs, the length cap, the
adversarial power tower that must come back "not equivalent" within the hard timeout, a worker killed by
its memory cap, and calls from a non-main thread (Prefect runs tasks in threads)."""

from __future__ import annotations

import threading
import time

import pytest

from sage.configs.schema import MathCheckConfig
from sage.engines.text.answers import extract_answer
from sage.engines.verify.mathcheck import MathChecker, answer_parses, normalize

TIMEOUT_S = 3.0

# (gold, prediction, equivalent?)
TABLE = [
    # fractions
    ("1/2", "0.5", True), ("\\frac{1}{2}", "\\dfrac{2}{4}", True), ("\\frac{3}{4}", "0.75", True),
    ("\\frac{1}{3}", "0.3333", False), ("\\frac{1}{3}", "\\frac13", True), ("2/3", "3/2", False),
    ("-\\frac{1}{2}", "-0.5", True), ("\\frac{1}{2}", "-\\frac{1}{2}", False),
    # decimals / integers
    ("3", "3.0", True), ("3", "3.00", True), ("0.1", "0.10", True), ("42", "43", False), ("1000", "1,000", True),
    ("3.14", "3.15", False), ("-7", "-7", True), ("7", "-7", False),
    # percentages
    ("50\\%", "50", True), ("25\\%", "25%", True), ("12.5\\%", "12.5", True), ("50\\%", "40\\%", False),
    # LaTeX vs plain
    ("\\sqrt{2}", "sqrt(2)", True), ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True), ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("\\pi", "pi", True), ("2\\pi", "\\pi", False), ("\\frac{\\pi}{2}", "pi/2", True), ("x^2", "x**2", True),
    ("x^2+2x+1", "(x+1)^2", True), ("x^2", "x^3", False), ("\\sqrt{2}", "1.41", False), ("e^{2}", "\\exp(2)", True),
    ("\\infty", "\\infty", True), ("\\infty", "-\\infty", False),
    # intervals
    ("(1,2)", "(1, 2)", True), ("[0,1)", "[0, 1)", True), ("[0,1]", "[0,1)", False),
    ("(-\\infty, 3]", "(-\\infty,3]", True),
    ("(0,1)\\cup(2,3)", "(0,1) \\cup (2,3)", True), ("(0,1)", "(0,2)", False),
    # sets
    ("\\{1,2\\}", "\\{2,1\\}", True), ("\\{1,2,3\\}", "\\{1,2\\}", False), ("\\{a, b\\}", "\\{b, a\\}", True),
    # tuples / points
    ("(1, 2)", "(1,2)", True), ("(3, -1)", "(3,-1)", True), ("(1, 2, 3)", "(1, 2)", False),
    # units
    ("5", "5 cm", True), ("5", "\\text{5 cm}", True), ("12", "12 \\text{ meters}", True),
    ("10", "10 \\mathrm{kg}", True),
    ("90", "90^\\circ", True), ("5", "6 cm", False),
    # scientific notation
    ("1500", "1.5e3", True), ("1500", "1.5 \\times 10^3", True), ("0.00025", "2.5 \\times 10^{-4}", True),
    ("3 \\times 10^8", "300000000", True), ("1500", "1.5e4", False), ("6.02e23", "6.02 \\times 10^{23}", True),
    # multiple answers
    ("2, 3", "3, 2", True), ("x = 2, x = 3", "2, 3", True), ("1, 2", "1, 3", False), ("-1, 1", "\\pm 1", True),
    ("2 \\text{ and } 3", "2, 3", True),
    # equations / expressions
    ("x = 5", "5", True), ("y = 2x + 1", "y = 1 + 2x", True), ("2x + 1", "2x + 2", False),
    # text
    ("Yes", "yes", True), ("\\text{No}", "no", True), ("Yes", "No", False),
]


@pytest.fixture(scope="module")
def checker():
    with MathChecker(MathCheckConfig(timeout_s=TIMEOUT_S, memory_mb=1024, max_answer_chars=200), workers=2) as mc:
        yield mc


@pytest.fixture(scope="module")
def table_scores(checker):
    return checker.check_many([(g, p) for g, p, _ in TABLE])


def test_table_is_big_enough():
    assert len(TABLE) >= 60
    assert sum(e for *_, e in TABLE) >= 20 and sum(not e for *_, e in TABLE) >= 20


@pytest.mark.parametrize("i", range(len(TABLE)), ids=[f"{g}|{p}" for g, p, _ in TABLE])
def test_table(table_scores, i):
    gold, pred, equivalent = TABLE[i]
    assert table_scores[i] == (1.0 if equivalent else 0.0), (gold, pred)


def test_adversarial_power_tower_times_out_as_not_equivalent(checker):
    start = time.monotonic()
    before = checker.timeouts
    assert checker.check_many([("10", "10^{10^{10^{10}}}"), ("1/2", "0.5")]) == [0.0, 1.0]
    assert time.monotonic() - start < TIMEOUT_S + 2.0
    assert checker.timeouts == before + 1
    # the killed worker was replaced: the pool still works
    assert checker.check_many([("\\frac{1}{4}", "0.25")] * 4) == [1.0] * 4


def test_boxed_power_tower_from_text(checker):
    pred = extract_answer("Clearly the result is \\boxed{10^{10^{10^{10}}}}.")
    assert pred == "10^{10^{10^{10}}}"
    start = time.monotonic()
    assert checker.check_many([("7", pred)]) == [0.0]
    assert time.monotonic() - start < TIMEOUT_S + 2.0


def test_memory_cap_kills_only_the_worker():
    with MathChecker(MathCheckConfig(timeout_s=10, memory_mb=256), workers=1) as mc:
        start = time.monotonic()
        # sympy expands this huge power; the 256 MiB cap stops it (MemoryError or death), never the parent
        assert mc.check_many([("1", "(x+1)^{100000}"), ("2", "2.0")]) == [0.0, 1.0]
        assert time.monotonic() - start < 10 + 5
        assert mc.timeouts == 0  # stopped by the memory cap, not by the deadline


def test_dead_worker_is_replaced(checker):
    import os
    import signal

    for w in list(checker._workers):
        os.kill(w.proc.pid, signal.SIGKILL)
    assert checker.check_many([("2", "2"), ("1/2", "0.5"), ("3", "\\frac{6}{2}")]) == [1.0, 1.0, 1.0]


def test_length_cap_scores_zero_unchecked(checker):
    long = "1" * 201
    assert checker.check_many([(long, long), ("1", "1" + " " * 300), ("1", None), ("1", "")]) == [0.0] * 4


def test_from_a_thread(checker):
    out, errors = [], []

    def work():
        try:
            out.append(checker.check_many([("1/2", "0.5"), ("3", "4")]))
            out.append(answer_parses("\\frac{1}{2}"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert out.count([1.0, 0.0]) == 3 and out.count(True) == 3


def test_answer_parses():
    assert answer_parses("\\frac{1}{2}") and answer_parses("42") and answer_parses("(0, 1]")
    assert not answer_parses("}}{{") and not answer_parses("")


def test_normalize():
    assert normalize("$1.5e3$") == "1.5\\times10^{3}"
    assert normalize("\\text{5 cm}") == "5 cm"
    assert normalize("x**2 + pi") == "x^2 + \\pi"
