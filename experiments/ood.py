"""The out-of-distribution test set: math problems of kinds no seed or validation problem has, fixed in a file.

    .venv/bin/python -m experiments.ood measure [--per 30] [--out DIR]
    .venv/bin/python -m experiments.ood build [--per 75]

Validation (and `experiments.heldout`'s fresh problems) are drawn from the seed pool's own generators, so a gain
there may be the loop fitting those generators. Transfer needs problems of other kinds that the bundled model
still partly solves; which kinds those are is measured, not guessed:

- `measure` draws `--per` problems of every candidate (`CANDIDATES`: reasoning-gym generators, or settings, of
  kinds no seed has, small enough for a 135M model), has the base model answer them through the real `validate`
  stage (greedy, the Solver's prompt and grammar, the math checker) in a warehouse of its own (`DIR/<candidates>`,
  default `sage-runs/ood-measure/all`), and prints each candidate's pass@1 with a Wilson interval, and how often
  the project's checker and reasoning-gym's own scorer (`score_answer`) agree on those answers.
- `build` writes `OOD_FILE` from the generators in `CHOSEN` (the candidates the base model solves some but not
  most of, by `measure`), `--per` each, from a generator seed other than `measure`'s (the generators were chosen
  on `measure`'s problems, the test set is not them), none whose normalised text or content
  (`arithmetic.content_key`) is a `cpu.yaml` seed or validation problem's. The file is committed, so the set stays
  fixed whatever reasoning-gym's next release draws. `experiments.heldout --ood` scores checkpoints on it.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from experiments.learning import wilson

OOD_FILE = Path(__file__).with_name("ood_math.jsonl")
#: label: (reasoning-gym generator, its settings). Kinds the seed mix (one-digit sums and products, chain sums,
#: x + a = b, GCD, LCM) has not: a word problem with world knowledge, a sequence's next term, decimals, angles,
#: bits, primes, fractions, probability, letters in a word, an unknown that is subtracted.
CANDIDATES: dict[str, tuple[str, dict]] = {
    "leg_counting": ("leg_counting", {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}),
    "number_sequence": ("number_sequence", {"min_terms": 4, "max_terms": 5, "min_value": 1, "max_value": 10,
                                            "max_complexity": 1}),
    "decimal_chain_sum": ("decimal_chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                                "min_decimal_places": 1, "max_decimal_places": 1}),
    "simple_geometry": ("simple_geometry", {"min_sides": 3, "max_sides": 3}),
    "count_bits": ("count_bits", {"min_n": 1, "max_n": 16}),
    "count_primes": ("count_primes", {"min_n": 1, "max_n": 20}),
    "fraction_simplification": ("fraction_simplification", {"min_value": 1, "max_value": 10, "min_factor": 2,
                                                            "max_factor": 5, "styles": ["plain"]}),
    "coin_flip": ("coin_flip", {"min_trials": 1, "max_trials": 3, "allow_exact": True, "allow_at_least": False}),
    "gsm_symbolic": ("gsm_symbolic", {}),
    "letter_counting": ("letter_counting", {"min_words": 1, "max_words": 2}),
    "subtracted_unknown": ("simple_equations", {"min_terms": 2, "max_terms": 2, "max_value": 10, "operators": ["-"],
                                                "operators_weights": [1.0]}),
    "decimal_division": ("decimal_arithmetic", {"min_num_decimal_places": 1, "max_num_decimal_places": 1,
                                                "min_terms": 2, "max_terms": 2}),
}
#: The candidates the base model solves some of, by `measure --per 30` (docs/learning.md, "The out-of-distribution
#: set"): decimal sums 4/30, an unknown that is subtracted 4/30, a sequence's next term 2/30, primes in a range
#: 1/28; every other candidate 0.
CHOSEN: list[str] = ["decimal_chain_sum", "subtracted_unknown", "number_sequence", "count_primes"]
MEASURE_SEED, BUILD_SEED = 31_000_031, 41_000_041


def _dataset(name: str, n: int, seed: int):
    import reasoning_gym

    generator, settings = CANDIDATES[name]
    return reasoning_gym.create_dataset(generator, size=n, seed=seed, **settings)


def draw(name: str, n: int, seed: int) -> list[dict]:
    """`n` problems of candidate `name`: reasoning-gym's entries (question, answer, metadata)."""
    ds = _dataset(name, n, seed)
    return [dict(ds[i]) for i in range(n)]


def _item(name: str, entry: dict):
    from sage.engines.data.seeds import SeedItem

    return SeedItem("math", entry["question"].strip(), {"answer": str(entry["answer"]).strip()},
                    f"ood:{name}", split="test")


def measure(per: int, out: Path, names: list[str]) -> dict:
    """The base model's pass@1 on `per` problems of each candidate in `names`, and checker parity with
    reasoning-gym's scorer on the same answers."""
    from sage.configs import load_config
    from sage.flows.session import Session
    from sage.stages import validate
    from sage.stages.seed import question_row
    from sage.warehouse.queries import start_iteration

    out = out / ("+".join(names) if names != list(CANDIDATES) else "all")   # a run of its own per set measured
    entries = {name: draw(name, per, MEASURE_SEED) for name in names}
    items = {(_item(name, e).question): (name, e) for name, es in entries.items() for e in es}
    cfg = load_config("cpu", [f"run.dir={out.resolve()}", f"validate.n_math={len(items)}", "validate.n_code=0"])
    with Session(out) as s:
        wh = s.warehouse
        run_id = s.create_run(cfg, "ood-measure")
        have = {r["text"] for r in wh.rows("SELECT text FROM questions")}
        wh.insert_batch("questions", [question_row(_item(*items[q])) for q in items if q not in have])
        start_iteration(wh, run_id, 0, None)
        validate.run(s.context_for(cfg, run_id, 0))
        rows = wh.rows("""SELECT q.text, v.s_gt, v.tests FROM rollouts r JOIN verdicts v USING (rollout_id)
                          JOIN questions q ON q.question_id = r.question_id
                          WHERE r.run_id = ? AND r.purpose = 'validate'""", [run_id])
    scorers = {name: _dataset(name, 1, MEASURE_SEED) for name in names}
    passed, total, agree = Counter(), Counter(), Counter()
    for r in rows:
        if r["text"] not in items:
            continue
        name, entry = items[r["text"]]
        pred = (json.loads(r["tests"]) if isinstance(r["tests"], str) else r["tests"] or {}).get("pred")
        theirs = scorers[name].score_answer(pred, entry) >= 1.0 if pred is not None else False
        ours = r["s_gt"] >= 1.0
        total[name] += 1
        passed[name] += ours
        agree[name] += ours == theirs
    return {name: {"passed": passed[name], "n": total[name], "agree": agree[name]} for name in names}


def build(per: int) -> list[dict]:
    """`per` problems of each chosen generator, none a seed's or validation problem's by text or content."""
    from sage.configs import load_config
    from sage.engines.data.seeds import default_math
    from sage.engines.text.arithmetic import content_key
    from sage.warehouse import norm_hash

    if not CHOSEN:
        raise SystemExit("CHOSEN is empty: run `measure` and list the generators to keep")
    s = load_config("cpu").seeds
    cpu = default_math(s.n_math, s.seed, "seed", s.math_generators) + default_math(
        load_config("cpu").validate.n_math, s.seed, "validation", s.math_generators)
    taken = {norm_hash(i.question) for i in cpu} | {k for i in cpu if (k := content_key(i.question))}
    rows = []
    for name in CHOSEN:
        kept = []
        for entry in draw(name, 4 * per, BUILD_SEED):
            item = _item(name, entry)
            keys = {norm_hash(item.question), content_key(item.question)} - {None}
            if keys & taken:
                continue
            taken |= keys
            kept.append({"source": item.source, "question": item.question, "answer": item.verifier["answer"]})
            if len(kept) == per:
                break
        if len(kept) < per:
            raise SystemExit(f"{name}: only {len(kept)} distinct problems of {per}")
        rows += kept
    return rows


def load_ood() -> list:
    """The fixed out-of-distribution problems of `OOD_FILE`, as test-split seed items."""
    from sage.engines.data.seeds import SeedItem

    if not OOD_FILE.exists():
        raise SystemExit(f"{OOD_FILE} does not exist: build it with `python -m experiments.ood build`")
    rows = [json.loads(line) for line in OOD_FILE.read_text().splitlines() if line.strip()]
    return [SeedItem("math", r["question"], {"answer": r["answer"]}, r["source"], split="test") for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["measure", "build"])
    ap.add_argument("--per", type=int, default=None, help="problems per candidate (measure 30, build 75)")
    ap.add_argument("--out", type=Path, default=Path("sage-runs/ood-measure"))
    ap.add_argument("--only", nargs="+", choices=list(CANDIDATES), help="measure these candidates only")
    args = ap.parse_args()
    if args.command == "measure":
        result = measure(args.per or 30, args.out, args.only or list(CANDIDATES))
        print("| generator | settings | base pass@1 [95% Wilson] | checker agrees with reasoning-gym |")
        print("|---|---|---|---|")
        for name, r in result.items():
            lo, hi = wilson(r["passed"], r["n"])
            print(f"| {name} | {CANDIDATES[name][0]} `{json.dumps(CANDIDATES[name][1])}` | {r['passed']}/{r['n']} = "
                  f"{r['passed'] / max(1, r['n']):.2f} [{lo:.2f}, {hi:.2f}] | {r['agree']}/{r['n']} |")
    else:
        rows = build(args.per or 75)
        OOD_FILE.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{len(rows)} problems ({', '.join(f'{n} {c}' for n, c in Counter(r['source'] for r in rows).items())})"
              f" -> {OOD_FILE}")


if __name__ == "__main__":
    main()
