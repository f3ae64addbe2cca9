"""How a benchmark's code verifier (the kinds `benchmarks.py` describes) runs in the sandbox, and what passes.

The sandbox only calls functions, so `code_job(verifier, code)` turns any code verifier into a `Job` (stdin
programs are wrapped in a function that feeds stdin and returns the captured stdout, whitespace-normalised)
and `code_passes(verifier, result)` decides; for functional and stdin kinds `expected_of(verifier)` gives the
outputs to compare with: `score_outputs(expected_of(v), result)`. `complete_code_verifiers` fills in the
expected outputs of verifiers that only carry a reference solution.
"""

from __future__ import annotations

from dataclasses import replace

from sage.engines.data.assertions import CHECK_SEED, check_job, judge
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
        return check_job(code, verifier["check"], verifier["entry_point"], verifier.get("seed", CHECK_SEED))
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
    """Whether a code answer passes every test: the official check's assertions for `check` verifiers
    (Python's own comparisons), every expected output otherwise (JSON-level equality, `score_outputs`)."""
    if verifier.get("kind") == "check":
        return judge(verifier["check"], result)[0]
    return score_outputs(expected_of(verifier), result)[0] == 1.0


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
