"""How a benchmark's code verifier (the kinds `benchmarks.py` describes) runs in the sandbox, and what passes.

The sandbox only calls functions, so `code_job(verifier, code)` turns any code verifier into a `Job` (stdin
programs are wrapped in a function that feeds stdin and returns the captured stdout, whitespace-normalised)
and `code_passes(verifier, result)` decides; for functional and stdin kinds `expected_of(verifier)` gives the
outputs to compare with. `complete_code_verifiers` fills in the expected outputs of verifiers that only
carry a reference solution.

Benchmark verdicts use each official harness's own comparison, applied in the parent to the values the
sandbox reported (the candidate's whole program runs, its entry point is called on each input):

- `check` verifiers (HumanEval, MBPP+ base asserts): every assertion with Python's operators (`assertions.py`).
- `"compare": "evalplus"` (MBPP+): evalplus's `assertion(out, exp, atol)`: `out == exp`, and only where that
  fails and atol is set (1e-6 when `exp` is a float or a list or tuple of floats)
  `numpy.testing.assert_allclose(out, exp, atol=atol)`. So 3 == 3.0 passes, 3.0000001 for 3 does not, and
  a list for a tuple does not.
- `"compare": "livecodebench"`: LiveCodeBench's call-based grading: a returned tuple becomes a list, then
  `prediction == expected` (its expected values are JSON).
- `"compare": "livecodebench-stdio"`: its stdin grading: the same number of stripped lines, each equal as
  text or else as a list of `Decimal`s (so `6.0` passes for `6`).

Generated (Challenger) tasks are different: their expected outputs were computed by a reference solution
and stored as JSON, which has no tuples, sets or int/float distinction and keeps floats only to their
printed digits, so they are compared at that level (`engines/verify/outputs.py`: a tuple equals a list,
floats within 1e-6). Comparing them with Python's `==` would fail correct answers for what storage did to
the reference's values; a benchmark's expected values are the official ones, and its verdicts must match
the official harness.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from sage.engines.data.assertions import CHECK_SEED, check_job, has_opaque, judge
from sage.engines.data.benchmarks import Problem
from sage.engines.data.humaneval import record_missing_inputs
from sage.engines.verify.outputs import reference_outputs, score_outputs
from sage.engines.verify.sandbox import ExecResult, Job, Sandbox

_IMPORTS = ("from typing import *\nfrom collections import *\nfrom itertools import *\nfrom functools import *\n"
            "from heapq import *\nfrom bisect import *\nimport math, heapq, bisect, itertools, functools, "
            "collections, string, re, sys\n")

_METHOD_SHIM = """

def __sage_call__(*args):
    if "Solution" in globals():
        return getattr(Solution(), {name!r})(*args)
    return globals()[{name!r}](*args)
"""

_STDIN_RUNNER = """
__sage_program__ = {program!r}


def __sage_stdin__(stdin_text):
    import io, sys
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    saved = sys.stdin, sys.stdout

    def _exit(*a):
        raise SystemExit(*a)

    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin_text.encode("utf-8")), encoding="utf-8")
    sys.stdout = out
    try:
        exec(compile(__sage_program__, "<program>", "exec"), {{"__name__": "__main__", "exit": _exit, "quit": _exit}})
    except SystemExit:
        pass
    finally:
        sys.stdin, sys.stdout = saved
    try:
        out.flush()
    except Exception:
        pass
    return "\\n".join(line.strip() for line in raw.getvalue().decode("utf-8", "replace").strip().split("\\n"))
"""


def normalize_stdout(text: str) -> str:
    """Output as compared for stdin tasks: surrounding blank lines dropped, each line stripped."""
    return "\n".join(line.strip() for line in str(text).strip().split("\n"))


def code_job(verifier: dict, code: str) -> Job:
    """A sandbox job running `code` (a candidate solution) on every test of a code verifier."""
    if verifier.get("kind") == "check":
        return check_job(code, verifier["check"], verifier["entry_point"], verifier.get("seed", CHECK_SEED),
                         verifier.get("helpers", ""))
    if verifier.get("kind") == "stdin":
        return Job(_STDIN_RUNNER.format(program=code), "__sage_stdin__", [[t[0]] for t in verifier["tests"]])
    if verifier.get("method_of"):
        return Job(_IMPORTS + code + _METHOD_SHIM.format(name=verifier["entry_point"]), "__sage_call__",
                   verifier["inputs"])
    return Job(code, verifier["entry_point"], verifier["inputs"])


def expected_of(verifier: dict) -> list:
    """Expected outputs of a code verifier, in the order of `code_job`'s inputs."""
    if verifier.get("kind") == "stdin":
        return [normalize_stdout(t[1]) for t in verifier["tests"]]
    if "outputs" not in verifier:
        raise ValueError("this verifier has a reference but no outputs yet: run complete_code_verifiers first")
    return verifier["outputs"]


def code_passes(verifier: dict, result: ExecResult) -> bool:
    """Whether a code answer passes every test: the official check's assertions for `check` verifiers, the
    official harness's comparison where the verifier names one (`compare`), every expected output otherwise
    (JSON-level equality, `score_outputs`)."""
    if verifier.get("kind") == "check":
        return judge(verifier["check"], result)[0]
    expected = expected_of(verifier)
    compare = verifier.get("compare")
    if compare is None:
        return score_outputs(expected, result)[0] == 1.0
    if compare not in _OFFICIAL:
        raise ValueError(f"unknown compare {compare!r} in a code verifier: use one of {sorted(_OFFICIAL)}")
    if len(result.outputs) < len(expected) or not expected:
        return False
    atol = float(verifier.get("atol") or 0.0)
    return all(err is None and not has_opaque(out) and _OFFICIAL[compare](out, exp, atol)
               for out, err, exp in zip(result.outputs, result.errors, expected))


def _evalplus_equal(out, exp, atol: float) -> bool:
    """evalplus's `assertion(out, exp, atol)`, as a verdict."""
    try:
        exact = out == exp
        floats = isinstance(exp, float) or isinstance(exp, (list, tuple)) and all(isinstance(x, float) for x in exp)
        if atol == 0 and floats:
            atol = 1e-6
        if exact or atol == 0:
            return bool(exact)
        from numpy.testing import assert_allclose

        assert_allclose(out, exp, atol=atol)
        return True
    except Exception:  # what fails or raises in the official assertion fails the test
        return False


def _livecodebench_equal(out, exp, atol: float) -> bool:
    """LiveCodeBench's call-based check: a tuple is taken as a list, then `==`."""
    try:
        return bool((list(out) if type(out) is tuple else out) == exp)
    except Exception:
        return False


def _livecodebench_stdio_equal(out, exp, atol: float) -> bool:
    """LiveCodeBench's stdin check: stripped lines, each equal as text or as its whitespace-split Decimals."""
    if type(out) is not str or type(exp) is not str:
        return False
    got, want = normalize_stdout(out).split("\n"), normalize_stdout(exp).split("\n")
    if len(got) != len(want):
        return False
    try:
        return all(g == w or [Decimal(x) for x in g.split()] == [Decimal(x) for x in w.split()]
                   for g, w in zip(got, want))
    except Exception:  # not numbers (decimal.InvalidOperation), or a signalling NaN
        return False


_OFFICIAL = {"evalplus": _evalplus_equal, "livecodebench": _livecodebench_equal,
             "livecodebench-stdio": _livecodebench_stdio_equal}


def complete_code_verifiers(problems: list[Problem], sandbox: Sandbox) -> list[Problem]:
    """Fill `outputs` of code verifiers that only have a `reference`, by running the reference in the
    sandbox (twice: nondeterministic references are dropped). HumanEval tasks whose inputs are built in
    loops get them first from their `check`. Returns the problems that have outputs, in order."""
    todo = [replace(p, verifier=dict(p.verifier)) for p in problems if p.domain == "code"
            and p.verifier.get("kind") != "check" and "reference" in p.verifier and "outputs" not in p.verifier]
    empty = [p for p in todo if not p.verifier["inputs"] and "check" in p.meta]
    tasks = [{"entry_point": p.verifier["entry_point"], "canonical_solution": p.verifier["reference"],
              "test": p.meta["check"], "inputs": []} for p in empty]
    for p, task in zip(empty, record_missing_inputs(tasks, sandbox)):
        p.verifier["inputs"] = task["inputs"]
    outputs = reference_outputs(sandbox, [Job(p.verifier["reference"], p.verifier["entry_point"], p.verifier["inputs"])
                                          for p in todo])
    filled = {(p.benchmark, p.problem_id): (p, out) for p, out in zip(todo, outputs)}
    done = []
    for p in problems:
        if (p.benchmark, p.problem_id) not in filled:
            done.append(p)
            continue
        q, out = filled[(p.benchmark, p.problem_id)]
        if out is not None and q.verifier["inputs"]:
            q.verifier["outputs"] = out
            done.append(q)
    return done
