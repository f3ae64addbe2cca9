"""experiments/heldout.py's test set: fresh, balanced across generators, reproducible, and a clear error when a
generator has too few problems left (the run on a tiny model is in test_learning.py)."""

from collections import Counter

import pytest

from experiments.heldout import fitting_n
from experiments.heldout import fresh_problems as draw
from sage.configs import load_config
from sage.engines.data.seeds import default_math
from sage.warehouse import norm_hash

SUMS = '{basic_arithmetic: {max_terms: 2, max_digits: 1, operators: ["+"], allow_parentheses: false, ' \
       'allow_negation: false}, gcd: {max_value: 20}}'


def test_balanced_fresh_and_the_same_every_time():
    cfg = load_config("cpu", [f"seeds.math_generators={SUMS}"])
    seen = {norm_hash(i.question) for split in ("seed", "validation") for i in default_math(100, 0, split, None)}
    seen |= {norm_hash(i.question) for i in default_math(40, 0, "validation", cfg.seeds.math_generators)}
    items = draw(cfg, seen, 41)
    assert Counter(i.source for i in items) == {"reasoning_gym:basic_arithmetic": 21, "reasoning_gym:gcd": 20}
    hashes = [norm_hash(i.question) for i in items]
    assert len(set(hashes)) == 41 and not set(hashes) & seen
    assert [i.question for i in draw(cfg, seen, 41)] == [i.question for i in items]


def test_a_generator_with_too_few_unseen_problems_is_named():
    cfg = load_config("cpu", [f"seeds.math_generators={SUMS}"])  # one-digit sums: about a hundred texts
    with pytest.raises(SystemExit, match=r"basic_arithmetic \d+ of 300.*lower --n"):
        draw(cfg, set(), 600)


def test_without_n_it_takes_as_many_as_every_generator_has_left_balanced():
    """The default of 300 where it fits; where a generator is short, the most that keeps every share equal, and
    that many then draw without error."""
    cfg = load_config("cpu", [f"seeds.math_generators={SUMS}"])
    assert fitting_n(cfg, set(), 40) == (40, "")
    n, short = fitting_n(cfg, set())
    assert "basic_arithmetic" in short and "gcd" not in short and n % 2 == 0 and 100 <= n < 300
    assert Counter(i.source for i in draw(cfg, set(), n)) == {"reasoning_gym:basic_arithmetic": n // 2,
                                                              "reasoning_gym:gcd": n // 2}
