"""What sandboxed code returned, compared with what was expected: type-aware equality, the s_gt of one run,
reference outputs from a solution that must agree with itself, and whether outputs survive JSON storage.

The sandbox (`sage.engines.verify.sandbox`) only runs code and returns typed values; every decision about them is here,
in the parent process.
"""

from __future__ import annotations

import json
import math

from sage.engines.verify.child import Opaque
from sage.engines.verify.sandbox import ExecResult, Job, Sandbox


def _num(x) -> bool:
    return type(x) in (int, float)


def outputs_equal(expected, actual) -> bool:
    """Type-aware equality: bool is not int, floats within 1e-6 (rel or abs), NaN == NaN, tuple == list,
    sets and dicts compared element-wise, recursive; opaque (repr-only) values never match. Never raises (an
    int past a float's range is not equal to any float) and takes n log n in the values' size: it runs on
    whatever a candidate returned, and one row's value may fail only that row."""
    try:
        return _equal(expected, actual, {})
    except Exception:  # RecursionError, MemoryError's kin: a comparison that cannot be made is not a match
        return False


def _equal(expected, actual, memo: dict) -> bool:
    if isinstance(expected, Opaque) or isinstance(actual, Opaque):
        return False
    te, ta = type(expected), type(actual)
    if te is bool or ta is bool:
        return te is ta and expected == actual
    if _num(expected) and _num(actual):
        if te is int and ta is int:
            return expected == actual
        try:
            e, a = float(expected), float(actual)
        except OverflowError:  # an int no float can hold: equal to no float
            return False
        if math.isnan(e) or math.isnan(a):
            return math.isnan(e) and math.isnan(a)
        return e == a or math.isclose(e, a, rel_tol=1e-6, abs_tol=1e-6)
    if te is complex or ta is complex:
        if te not in (int, float, complex) or ta not in (int, float, complex):
            return False
        try:
            e, a = complex(expected), complex(actual)
        except OverflowError:
            return False
        return _equal(e.real, a.real, memo) and _equal(e.imag, a.imag, memo)
    if te in (list, tuple) and ta in (list, tuple):
        return len(expected) == len(actual) and all(_equal(x, y, memo) for x, y in zip(expected, actual))
    if te in (set, frozenset) and ta in (set, frozenset):
        return _match_all(list(expected), list(actual), lambda v: _order(v, memo), memo)
    if te is dict and ta is dict:
        return _match_all(list(expected.items()), list(actual.items()),
                          lambda kv: (_order(kv[0], memo), _order(kv[1], memo)), memo)
    if te is not ta:
        return False
    return expected == actual if te in (str, bytes, type(None)) else False


GREEDY_MAX = 16  # a set or dict this small is also matched by search when the sorted pairing fails


def _match_all(expected: list, actual: list, key, memo: dict) -> bool:
    """One-to-one matching under outputs_equal (for set elements and dict items): both sides sorted by `key`
    (`_order`), then compared pairwise, in O(n log n); a pairwise search over every item was quadratic (98 s
    for 8,000 dict items). Sorting pairs values within the float tolerance as a one-dimensional matching does;
    where items hold floats in more than one place ({(0.3, 'a'), (0.30000000000000004, 'b')} against the
    swapped pair) the sorted pairing can miss a match, so a set or dict of at most GREEDY_MAX items is then
    searched whole."""
    if len(expected) != len(actual):
        return False
    if all(_equal(x, y, memo) for x, y in zip(sorted(expected, key=key), sorted(actual, key=key))):
        return True
    if len(expected) > GREEDY_MAX:
        return False
    left = list(actual)
    for e in expected:
        for j, a in enumerate(left):
            if _equal(e, a, memo):
                del left[j]
                break
        else:
            return False
    return True


def _order(value, memo: dict) -> tuple:
    """A total order on decoded values that keeps outputs_equal's classes together: bool apart from numbers,
    int and float by value (NaN apart), list and tuple alike, sets and dicts by their sorted items. A
    container's key is computed once per comparison (`memo`, by identity, holding the value so its id stays
    its own): recomputing it at every level of a nested value cost size times depth."""
    t = type(value)
    if t is bool:
        return (0, value)
    if t in (int, float):
        return (2,) if value != value else (1, value)
    if t is complex:
        return (3, _order(value.real, memo), _order(value.imag, memo))
    if t is str:
        return (4, value)
    if t is bytes:
        return (5, value)
    if value is None:
        return (6,)
    if t not in (list, tuple, set, frozenset, dict):
        return (10, id(value))  # Opaque and anything else: equal to nothing, placed anywhere
    cached = memo.get(id(value))
    if cached is not None:
        return cached[1]
    if t in (list, tuple):
        key = (7, tuple(_order(x, memo) for x in value))
    elif t is dict:
        key = (9, tuple(sorted((_order(k, memo), _order(v, memo)) for k, v in value.items())))
    else:
        key = (8, tuple(sorted(_order(x, memo) for x in value)))
    memo[id(value)] = (value, key)
    return key


def score_outputs(expected: list, result: ExecResult) -> tuple[float, list[bool]]:
    """s_gt = fraction of test inputs whose output equals the expected one; and the per-test list."""
    passed = []
    for i, exp in enumerate(expected):
        ok = i < len(result.outputs) and result.errors[i] is None and outputs_equal(exp, result.outputs[i])
        passed.append(bool(ok))
    return (sum(passed) / len(passed) if passed else 0.0), passed


def reference_outputs(sandbox: Sandbox, jobs: list[Job], repeats: int = 2) -> list[list | None]:
    """Expected outputs from reference solutions: each job runs `repeats` times; a job that fails or is
    nondeterministic (random, time, set order, ...) gets None, so its task cannot be used as a verifier."""
    return [outputs for outputs, _ in reference_runs(sandbox, jobs, repeats)]


def reference_runs(sandbox: Sandbox, jobs: list[Job], repeats: int = 2) -> list[tuple[list | None, str | None]]:
    """`reference_outputs` with the reason a job gives none: (outputs, None) or (None, why), the why worded
    for the person who wrote the reference (its first error, a timeout, outputs that differ between runs)."""
    results = sandbox.execute([j for j in jobs for _ in range(repeats)])
    out: list[tuple[list | None, str | None]] = []
    for k in range(len(jobs)):
        runs = results[k * repeats:(k + 1) * repeats]
        first = runs[0]
        failed = next((r for r in runs if r.status != "ok"), None)
        if failed is not None:
            error = next((e for e in failed.errors if e), None)
            out.append((None, f"the reference solution failed ({failed.status}{': ' + error if error else ''})"))
        elif not all(_match_exact(first.outputs, r.outputs) for r in runs[1:]):
            out.append((None, f"the reference solution gave different outputs in {repeats} runs (nondeterministic)"))
        else:
            out.append((first.outputs, None))
    return out


def _match_exact(a: list, b: list) -> bool:
    return len(a) == len(b) and all(outputs_equal(x, y) for x, y in zip(a, b))


def storable(outputs: list | None) -> list | None:
    """The outputs as they will be stored (JSON), or None when storage would change them (sets, objects) or
    cannot write them."""
    if outputs is None:
        return None
    try:
        stored = json.loads(json.dumps(outputs, default=repr))
    except Exception:  # an int past Python's 4,300-digit str limit, a tuple as a dict key, nesting json refuses
        return None
    return stored if outputs_equal(outputs, stored) else None
