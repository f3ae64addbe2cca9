"""The checkpoint a learning run keeps, against the base model, on a fresh test set it was never chosen on.

    .venv/bin/python -m experiments.heldout --out DIR [--n N | --ood | --validation] [--pipeline]
        [--iteration K ... | --all]

`experiments/learning.py` picks the best checkpoint on its validation set, so that set's score of the pick is
biased upwards (the best of N noisy scores) and its McNemar test against the base model is too optimistic. This
measures the pick again on test problems that took no part in any choice: `--n` math problems of the run's own
generators (`seeds.math_generators`; default 300, or fewer when a generator has not that many left: as many as
keep every generator's share equal, which it says; an explicit `--n` that does not fit is an error naming the
short ones), as many of each generator as the others (the validation set's mix), drawn from generator seeds
disjoint from the seed and validation splits (`SPLIT_OFFSETS`), and none
with the text of a question the run's warehouse holds (seed, validation or generated). The base model and
the checkpoints asked for (default: the one validation kept, `checkpoints.is_best`; `--all`: every
trained one) each answer every problem through the real `validate` stage (greedy, the Solver's prompt and
grammar, the math checker), in a warehouse of its own (`DIR/heldout-<n>/`, the test problems as its
validation questions), so the run's own warehouse is only read. Math only: the bundled code tasks have no
third split (their second half is the validation set). Reports, for every checkpoint answered so far, pass@1
with 95% Wilson intervals, per generator, and the exact McNemar test against the base model on the problems
whose outcome differs, beside its validation pass@1. Rerunning generates nothing already answered. Writes
`DIR/heldout-<n>.md` and `DIR/heldout-<n>.json`.

`--pipeline` also answers through the Planner -> gate -> Solver pipeline (`validate.pipeline`: each checkpoint's own
greedy plan, its Critic score and the answer shown it) and reports, per checkpoint, pass@1 with every plan shown and
with the gate, against the plain answers on the same problems (exact McNemar): whether plans help at inference.
`--validation` answers the run's own validation problems (in `DIR/heldout-validation/`), which are no test of a
kept checkpoint but are where the base model's answers with and without its plans are measured before training.

`--ood` tests on the fixed out-of-distribution set instead (`experiments/ood.py`: kinds of problem no seed or
validation problem has, which the base model partly solves), in `DIR/heldout-ood/`, writing `heldout-ood.md` and
`.json`. Every set's report counts the test problems the run's pool holds by text or content (a Challenger may write
one; a fresh problem, drawn unlike every text of the run, may ask what a seed asks in other words).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from experiments.learning import validation, wilson

DEFAULT_N = 300


def fitting_n(cfg, seen: set[str], n: int = DEFAULT_N) -> tuple[int, str]:
    """`n`, or, when a generator has fewer problems outside `seen` than its share of `n`, the most that keeps
    every generator's share equal (the generators times the fewest any has); and which were short ('' if none)."""
    from collections import Counter

    from sage.stages.seed import distinct_math

    items, short = distinct_math(n, cfg.seeds.seed, "test", cfg.seeds.math_generators, seen)
    if not short:
        return n, ""
    counts = Counter(i.source for i in items)
    names = [f"reasoning_gym:{name}" for name in cfg.seeds.math_generators or {}] or list(counts)
    fewest = min(counts.get(name, 0) for name in names)
    if not fewest:
        raise SystemExit(f"a generator has no problem the run has not seen ({short}); nothing to test on")
    return fewest * len(names), short


def fresh_problems(cfg, seen: set[str], n: int) -> list:
    """`n` test problems, as many per generator (the remainder to the first ones), none whose normalised text
    is in `seen`. A generator whose space is too small is an error that says how many it has."""
    from sage.stages.seed import distinct_math

    items, short = distinct_math(n, cfg.seeds.seed, "test", cfg.seeds.math_generators, seen)
    if short:
        raise SystemExit(f"the generators have too few problems the run has not seen ({short}); lower --n")
    return items


def _source_rows(wh, run_id: str, k: int) -> dict[str, tuple[int, int]]:
    rows = wh.rows("""SELECT q.source, count(*) AS n, sum((v.s_gt >= 1.0)::INT) AS passed FROM rollouts r
                      JOIN verdicts v USING (rollout_id) JOIN questions q ON q.question_id = r.question_id
                      WHERE r.run_id = ? AND r.iteration = ? AND r.purpose = 'validate' GROUP BY ALL""", [run_id, k])
    return {r["source"]: (int(r["passed"]), int(r["n"])) for r in rows}


def _read_run(out: Path) -> dict:
    """The learning run's id and config, every trained iteration's adapter, the kept checkpoint, every question
    text the run's warehouse holds, and the validation pass@1 per iteration (what the kept one was chosen on)."""
    from sage.warehouse import Warehouse
    from sage.warehouse.queries import located_path
    from sage.warehouse.runs import load_run_config

    path = out / "warehouse.duckdb"
    if not path.exists():
        raise SystemExit(f"{path} does not exist: --out is the folder of a `experiments.learning` run")
    with Warehouse.open(path, read_only=True) as wh:
        runs = [r["run_id"] for r in wh.rows("SELECT run_id FROM runs ORDER BY run_id")]
        if len(runs) != 1:
            raise SystemExit(f"{path} holds {len(runs)} runs ({', '.join(runs)}); an experiments.learning folder "
                             f"holds one")
        run_id = runs[0]
        return {"run_id": run_id, "cfg": load_run_config(wh, run_id),
                "adapters": {r["iteration"]: located_path(wh, r["adapter_out"]) for r in wh.rows(
                    "SELECT iteration, adapter_out FROM iterations WHERE run_id = ? AND adapter_out IS NOT NULL",
                    [run_id])},
                "kept": wh.scalar("SELECT iteration FROM checkpoints WHERE run_id = ? AND is_best", [run_id]),
                "seen": {r["norm_hash"] for r in wh.rows("SELECT norm_hash FROM questions")},
                "validation_rows": wh.rows("SELECT * EXCLUDE (created_at) FROM questions WHERE origin = 'validation' "
                                           "ORDER BY question_id"),
                "trained_texts": [r["text"] for r in wh.rows(
                    "SELECT text FROM questions WHERE origin = 'seed' OR (origin = 'generated' AND admitted)")],
                "validation": {r["iteration"]: r["val_accuracy"] for r in wh.rows(
                    "SELECT iteration, val_accuracy FROM checkpoints WHERE run_id = ?", [run_id])}}


def pool_overlap(tested: list[str], trained_texts: list[str]) -> int:
    """How many of the `tested` question texts the run's pool (seeds and admitted questions) holds, by normalised
    text or by content (`arithmetic.content_key`: the same sum, equation, GCD or LCM in other words): a Challenger
    that writes a test problem trains on it, and a fresh problem (drawn unlike every text of the run) may still ask
    what a seed asks."""
    from sage.engines.text.arithmetic import content_key
    from sage.warehouse import norm_hash

    pool = {norm_hash(t) for t in trained_texts} | {k for t in trained_texts if (k := content_key(t))}
    return sum(bool({norm_hash(t), content_key(t)} & pool) for t in tested)


def test_set(ood: bool, validation: bool, n: int | None) -> str:
    """The name of the problem set and of its folder's suffix: `ood`, `validation` or the number of fresh ones."""
    return "ood" if ood else "validation" if validation else str(n)


def evaluate(out: Path, n: int | None, iterations: list[int] | None = None, every: bool = False,
             ood: bool = False, validation_set: bool = False, pipeline: bool = False) -> dict:
    """Answer the test set of `n` problems (None: `fitting_n`; with `ood`, the fixed out-of-distribution set
    instead; with `validation_set`, the run's validation problems) with the base model and the checkpoints asked for
    (default: the kept one; `every`: all trained ones; [0]: the base model alone), through the pipeline too with
    `pipeline`, only what is missing, and the results of every checkpoint answered so far."""
    from sage.flows.session import Session
    from sage.stages import validate
    from sage.stages.seed import question_row
    from sage.warehouse.queries import set_iteration_adapter, start_iteration
    from sage.warehouse.validate_queries import count_validation_questions

    run = _read_run(out)
    run_id, adapters = run["run_id"], run["adapters"]
    if every:
        iterations = sorted(adapters)
    elif iterations == [0]:
        iterations = []
    elif not iterations:
        if not run["kept"]:
            kept = "the base model" if run["kept"] == 0 else "not chosen yet"
            raise SystemExit(f"run {run_id}'s kept checkpoint is {kept}: nothing to compare; "
                             f"give --iteration K or --all")
        iterations = [run["kept"]]
    missing = [k for k in iterations if k not in adapters]
    if missing:
        raise SystemExit(f"run {run_id} has no trained adapter for iteration(s) {missing}; it has {sorted(adapters)}")
    ood_items = None
    if ood:
        from experiments.ood import load_ood

        ood_items = load_ood()
        n = len(ood_items)
    elif validation_set:
        n = len(run["validation_rows"])
    elif n is None:
        n, short = fitting_n(run["cfg"], run["seen"])
        if short:
            print(f"[heldout] {n} test problems, not {DEFAULT_N}: the generators have too few the run has not seen "
                  f"({short}); --n sets the number", flush=True)
    folder = out / f"heldout-{test_set(ood, validation_set, n)}"
    validate_cfg = {"n_math": n, "n_code": 0, "pipeline": pipeline}
    cfg = run["cfg"].model_copy(update={"run": run["cfg"].run.model_copy(update={"dir": str(folder.resolve())}),
                                        "validate": run["cfg"].validate.model_copy(update=validate_cfg)})
    with Session(folder) as s:
        wh = s.warehouse
        s.create_run(cfg, run_id)
        if not count_validation_questions(wh):  # drawn once: the run may have generated more questions since
            wh.insert_batch("questions", run["validation_rows"] if validation_set else
                            [question_row(i) for i in ood_items or fresh_problems(cfg, run["seen"], n)])
        for k in [0, *iterations]:
            start_iteration(wh, run_id, k, None)
            if k:
                set_iteration_adapter(wh, run_id, k, adapters[k])
            start = time.perf_counter()
            done = validate.run(s.context_for(cfg, run_id, k))
            print(f"[heldout] iteration {k} ({'base model' if k == 0 else adapters[k]}): pass@1 "
                  f"{done.info['val_accuracy']:.3f} on {done.rows_in} problems, {done.rows_out} answered now, "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
        tested = [r["text"] for r in wh.rows("SELECT text FROM questions WHERE origin = 'validation'")]
        answered = [r["iteration"] for r in wh.rows(
            "SELECT DISTINCT iteration FROM rollouts WHERE run_id = ? AND purpose = 'validate' ORDER BY 1", [run_id])]
        return {"run_id": run_id, "n": n, "set": "ood" if ood else "validation" if validation_set else "fresh",
                "kept": run["kept"], "in_pool": pool_overlap(tested, run["trained_texts"]),
                "iterations": {k: {"adapter": adapters.get(k), "validation": run["validation"].get(k),
                                   "test": validation(wh, run_id, k), "sources": _source_rows(wh, run_id, k),
                                   "pipeline": plans_at_inference(wh, run_id, k, cfg.iteration.beta)}
                               for k in answered}}


def plans_at_inference(wh, run_id: str, k: int, beta: float) -> dict | None:
    """Checkpoint k's answers through the pipeline against its plain ones on the same problems: pass@1 with every
    plan shown and with the gate, each with the exact McNemar test against the plain answers (b / c: lost / gained);
    None where the pipeline was not answered."""
    from experiments.learning import mcnemar_exact
    from sage.stages.validate import pipeline_outcomes
    from sage.warehouse.validate_queries import pipeline_rows

    rows = pipeline_rows(wh, run_id, k)
    if not rows:
        return None
    outcomes = pipeline_outcomes(rows, beta)
    plain = outcomes["plain"]
    out = {"n": len(rows), "plain": sum(plain), "plans_passed": sum(outcomes["passed"])}
    for name in ("shown", "pipeline"):
        answers = outcomes[name]
        b = sum(a and not x for a, x in zip(plain, answers))
        c = sum(x and not a for a, x in zip(plain, answers))
        out[name] = {"passed": sum(answers), "lost": b, "gained": c, "p": mcnemar_exact(b, c)}
    return out


def report(result: dict, command: str) -> str:
    its = result["iterations"]
    ks = sorted(its)

    def share(passed: int, total: int) -> str:
        lo, hi = wilson(passed, total)
        return f"{passed / total:.3f} [{lo:.2f}, {hi:.2f}] ({passed}/{total})" if total else "-"

    def total(k: int) -> tuple[int, int]:
        return sum(p for p, _ in its[k]["sources"].values()), sum(t for _, t in its[k]["sources"].values())

    def row(name: str, cells: list[str]) -> str:
        return f"| {name} | " + " | ".join(cells) + " |"

    kept = result["kept"]
    kind = {"ood": "out-of-distribution", "validation": "validation"}.get(result.get("set"), "fresh")
    lines = [f"# Checkpoints against the base model on {total(0)[1]} {kind} test problems (run {result['run_id']})",
             "", f"- command: `.venv/bin/python -m experiments.heldout {command}`",
             f"- test problems the run's pool (seeds and admitted questions) also holds, by text or content: "
             f"{result.get('in_pool', 0)}",
             f"- the kept checkpoint (chosen on validation): iteration {kept}; adapters: "
             f"{Path(its[ks[-1]]['adapter']).parent if its[ks[-1]]['adapter'] else '-'}", "",
             row("iteration", [f"{k}{' (kept)' if k == kept else ''}" for k in ks]), "|---|" + "---:|" * len(ks),
             row("validation pass@1 (chosen on)", [f"{its[k]['validation']}" for k in ks]),
             row("test pass@1 [95% Wilson]", [share(*total(k)) for k in ks]),
             row("vs base on test: gained / lost, exact McNemar p",
                 ["" if k == 0 else f"{its[k]['test']['mcnemar_c']} / {its[k]['test']['mcnemar_b']}, "
                                    f"{its[k]['test']['mcnemar_p']:.3g}" for k in ks])]
    lines += [row(src, [share(*its[k]["sources"].get(src, (0, 0))) for k in ks]) for src in sorted(its[0]["sources"])]
    if any(its[k].get("pipeline") for k in ks):
        def through(k: int, name: str) -> str:
            p = its[k].get("pipeline")
            if not p:
                return "-"
            s = p[name]
            return f"{share(s['passed'], p['n'])}; vs plain {s['lost']} / {s['gained']}, {s['p']:.3g}"

        lines += [row("every plan shown: pass@1 [95%]; vs plain answers lost / gained, p", [through(k, "shown")
                                                                                            for k in ks]),
                  row("pipeline (shown where the gate passed): pass@1; vs plain", [through(k, "pipeline") for k in ks]),
                  row("plans that passed the gate", [f"{its[k]['pipeline']['plans_passed']} / {its[k]['pipeline']['n']}"
                                                     if its[k].get("pipeline") else "-" for k in ks])]
    return "\n".join(lines) + "\n"


def main() -> None:
    import shlex
    import sys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the folder of an experiments.learning run")
    ap.add_argument("--n", type=int, help=f"test problems (default {DEFAULT_N}, or as many as every generator "
                                           f"has left, balanced)")
    ap.add_argument("--iteration", type=int, action="append", default=[],
                    help="a checkpoint to test (repeatable; default: the one validation kept; 0: the base model alone)")
    ap.add_argument("--all", action="store_true", help="test every trained checkpoint")
    ap.add_argument("--ood", action="store_true", help="test on the fixed out-of-distribution set "
                    "(experiments/ood_math.jsonl) instead of fresh problems of the run's generators")
    ap.add_argument("--validation", action="store_true", help="answer the run's own validation problems (no test "
                    "of a kept checkpoint: where plans at inference are measured, with --pipeline)")
    ap.add_argument("--pipeline", action="store_true", help="also answer through the Planner -> gate -> Solver "
                    "pipeline and report it against the plain answers")
    args = ap.parse_args()
    if (args.ood or args.validation) and args.n is not None:
        ap.error("--ood and --validation test on a whole fixed set; --n does not apply")
    if args.ood and args.validation:
        ap.error("--ood and --validation name two different sets; give one")
    if args.n is not None and args.n < 1:
        ap.error("--n must be at least 1")
    out = Path(args.out)
    result = evaluate(out, args.n, args.iteration, args.all, args.ood, args.validation, args.pipeline)
    text = report(result, shlex.join(sys.argv[1:]))
    name = f"heldout-{test_set(args.ood, args.validation, result['n'])}"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    (out / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
