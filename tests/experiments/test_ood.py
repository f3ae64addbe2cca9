"""experiments/ood.py's fixed out-of-distribution set: the chosen kinds in equal shares, none of them a seed's or a
validation problem's by text or by content, and heldout's count of test problems a run's pool holds."""

from collections import Counter

from experiments.heldout import pool_overlap
from experiments.ood import CHOSEN, load_ood
from sage.configs import load_config
from sage.engines.data.seeds import default_math
from sage.engines.text.arithmetic import content_key
from sage.warehouse import norm_hash


def test_the_set_holds_the_chosen_kinds_in_equal_shares_and_no_problem_twice():
    items = load_ood()
    counts = Counter(i.source for i in items)
    assert set(counts) == {f"ood:{name}" for name in CHOSEN} and len(set(counts.values())) == 1
    assert len({norm_hash(i.question) for i in items}) == len(items)
    assert all(i.domain == "math" and i.verifier["answer"] for i in items)


def test_no_problem_is_a_seed_or_a_validation_problem_of_the_defaults():
    cfg = load_config("cpu")
    s = cfg.seeds
    cpu = default_math(s.n_math, s.seed, "seed", s.math_generators) + default_math(
        cfg.validate.n_math, s.seed, "validation", s.math_generators)
    items = load_ood()
    assert pool_overlap([i.question for i in items], [i.question for i in cpu]) == 0


def test_a_pool_that_holds_a_test_problem_in_other_words_is_counted():
    items = load_ood()
    equation = next(i for i in items if i.source == "ood:subtracted_unknown" and content_key(i.question))
    reworded = "Solve for the unknown: " + equation.question.split(":", 1)[1].strip()
    tested = [i.question for i in items]
    assert pool_overlap(tested, [reworded, "What is 2 + 2?"]) == 1
    assert pool_overlap(tested, [items[0].question.upper()]) == 1
    # a fresh test problem drawn unlike every text of the run is counted when a seed asks the same in other words
    assert pool_overlap(["What is 3 + 4?", "What is 9 + 9?"], ["Calculate 3 + 4.", "What is 1 + 1?"]) == 1
