"""MBPP+ and LiveCodeBench verdicts match their official harnesses: hand-made answers (an int against a float
near-miss, a list for a tuple, float tolerance, a test that calls the candidate's own helper) go through the
loaders, the sandbox and `code_passes`, and each verdict is compared with the official assertion run
directly (in a separate interpreter, on these trusted hand-made programs). Where the JSON-level comparison of
generated tasks would differ, the test says so."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.data.benchmarks import load_benchmark
from sage.engines.data.code_jobs import code_job, code_passes, expected_of
from sage.engines.verify.outputs import score_outputs
from sage.engines.verify.sandbox import Sandbox

# evalplus's MBPP+ test code, as its `test` field carries it (the inputs, results, entry point and atol vary)
EVALPLUS_TEST = '''
import numpy as np
from math import inf

def is_floats(x) -> bool:
    # check if it is float; List[float]; Tuple[float]
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def assertion(out, exp, atol):
    exact_match = out == exp

    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        np.testing.assert_allclose(out, exp, atol=atol)
    else:
        assert exact_match


inputs = {inputs!r}
results = {results!r}
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion({entry}(*inp), exp, {atol})
'''

# LiveCodeBench's call-based grading (lcb_runner/evaluation/testing_util.py, grade_call_based), reduced to
# what decides a verdict once the method returned
LCB_OFFICIAL = '''
import json, sys
from typing import *
program, func_name, inputs, outputs = json.loads(sys.stdin.read())
ns = {}
exec("from typing import *\\n" + program, ns)
method = getattr(ns["Solution"](), func_name)
for gt_inp, gt_out in zip(inputs, outputs):
    gt_inp = [json.loads(line) for line in gt_inp.split("\\n")]
    prediction = method(*gt_inp)
    if isinstance(prediction, tuple):
        prediction = list(prediction)
    if not prediction == json.loads(gt_out):
        sys.exit(1)
'''

# LiveCodeBench's stdin grading (grade_stdio: get_stripped_lines, convert_line_to_decimals), each program
# run as a script on the test's stdin
LCB_STDIO_OFFICIAL = '''
import json, subprocess, sys
from decimal import Decimal
program, inputs, outputs = json.loads(sys.stdin.read())

def get_stripped_lines(val):
    val = val.strip()
    return [val_line.strip() for val_line in val.split("\\n")]

def convert_line_to_decimals(line):
    try:
        decimal_line = [Decimal(elem) for elem in line.split()]
    except Exception:
        return False, []
    return True, decimal_line

for gt_inp, gt_out in zip(inputs, outputs):
    prediction = subprocess.run([sys.executable, "-c", program], input=gt_inp, capture_output=True, text=True).stdout
    stripped_prediction_lines = get_stripped_lines(prediction)
    stripped_gt_out_lines = get_stripped_lines(gt_out)
    if len(stripped_prediction_lines) != len(stripped_gt_out_lines):
        sys.exit(1)
    for stripped_prediction_line, stripped_gt_out_line in zip(stripped_prediction_lines, stripped_gt_out_lines):
        if stripped_prediction_line == stripped_gt_out_line:
            continue
        success, decimal_prediction_line = convert_line_to_decimals(stripped_prediction_line)
        if not success:
            sys.exit(1)
        success, decimal_gtout_line = convert_line_to_decimals(stripped_gt_out_line)
        if not success:
            sys.exit(1)
        if decimal_prediction_line == decimal_gtout_line:
            continue
        sys.exit(1)
'''

# name -> (inputs, results, atol, {candidate program: official verdict the test expects})
MBPP_PLUS = {
    "square": ([[3], [2]], [9, 4], 0, {
        "def square(n):\n    return n * n\n": True,
        "def square(n):\n    return float(n * n)\n": True,  # 9.0 == 9 in Python
        "def square(n):\n    return n * n + 1e-7\n": False,  # an int result compares with ==: no tolerance
    }),
    "pair": ([[1, 2]], [(1, 2)], 0, {
        "def pair(a, b):\n    return (a, b)\n": True,
        "def pair(a, b):\n    return [a, b]\n": False,  # a list is not the tuple the test expects
    }),
    "third": ([[1]], [0.3], 0, {
        "def third(x):\n    return 0.1 + 0.2 * x\n": True,  # float result: 1e-6 tolerance
        "def third(x):\n    return 0.3 + 1e-5\n": False,
    }),
    "approx_pi": ([[0]], [3.14159], 0.001, {
        "def approx_pi(x):\n    return 3.1416\n": True,  # the task's own atol
        "def approx_pi(x):\n    return 3.15\n": False,
    }),
}

# base asserts only (the plus tests are not literals): the test calls the candidate's own `decode` helper
HELPER_ROW_TESTS = ["assert decode(shift('abc')) == 'abc'", "assert shift('ab') == 'bc'", "assert size('ab') == 2"]
HELPER = {
    "def shift(s):\n    return ''.join(chr(ord(c) + 1) for c in s)\n"
    "def decode(s):\n    return ''.join(chr(ord(c) - 1) for c in s)\n"
    "def size(s):\n    return len(s)\n": True,
    "def shift(s):\n    return ''.join(chr(ord(c) + 1) for c in s)\n"
    "def decode(s):\n    return s\n"
    "def size(s):\n    return len(s)\n": False,
    "def shift(s):\n    return ''.join(chr(ord(c) + 1) for c in s)\n"
    "def decode(s):\n    return ''.join(chr(ord(c) - 1) for c in s)\n"
    "def size(s):\n    return len(s) + 1e-9\n": False,
}

LCB_TESTS = [{"input": "[1, 2]", "output": "[2, 1]", "testtype": "functional"},
             {"input": "[5, 0]", "output": "[0, 5]", "testtype": "functional"}]
LCB = {
    "class Solution:\n    def flip(self, xs: List[int]) -> List[int]:\n        return xs[::-1]\n": True,
    "class Solution:\n    def flip(self, xs):\n        return tuple(xs[::-1])\n": True,  # a tuple is taken as a list
    "class Solution:\n    def flip(self, xs):\n        return [float(x) for x in xs[::-1]]\n": True,  # 2.0 == 2
    "class Solution:\n    def flip(self, xs):\n        return [x + 1e-9 for x in xs[::-1]]\n": False,
    "class Solution:\n    def flip(self, xs):\n        return [(x,) for x in xs[::-1]]\n": False,
}

LCB_STDIO_TESTS = [{"input": "3\n1 2 3\n", "output": "6\n0.5\n", "testtype": "stdin"},
                   {"input": "2\n4 6\n", "output": "10\n0.5\n", "testtype": "stdin"}]
LCB_STDIO = {
    "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs))\nprint(0.5)\n": True,
    "input()\nxs = input().split()\nprint(float(sum(map(int, xs))), ' ')\nprint('0.50')\n\n": True,  # 6.0 is 6
    "input()\nxs = input().split()\nprint(sum(map(int, xs)) + 1e-9)\nprint(0.5)\n": False,
    "input()\nxs = input().split()\nprint(sum(map(int, xs)), 0.5)\n": False,  # one line, not two
    "input()\nxs = input().split()\nprint(sum(map(int, xs)))\nprint('half')\n": False,
}


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(timeout_s=20, cpu_s=10, workers=2))


def _official(script: list[str], stdin: str = "") -> bool:
    run = subprocess.run([sys.executable, *script], input=stdin, capture_output=True, text=True, timeout=60)
    return run.returncode == 0


def test_mbppplus_verdicts_match_evalplus(tmp_path, sandbox):
    rows = [{"task_id": k, "code": next(iter(cands)), "prompt": f"Write {entry}.", "test_imports": [],
             "test_list": [f"assert {entry}(*{inputs[0]!r}) == {results[0]!r}"],
             "test": EVALPLUS_TEST.format(inputs=inputs, results=results, entry=entry, atol=atol)}
            for k, (entry, (inputs, results, atol, cands)) in enumerate(MBPP_PLUS.items())]
    rows.append({"task_id": 99, "code": next(iter(HELPER)), "prompt": "Write shift.", "test_imports": ["import math"],
                 "test_list": HELPER_ROW_TESTS, "test": "inputs = [[float('inf')]]\nresults = [1]\n"})
    pd.DataFrame(rows).to_parquet(tmp_path / "mbpp.parquet")
    problems = load_benchmark("mbppplus", path=tmp_path / "mbpp.parquet")
    assert [p.verifier.get("compare") for p in problems] == ["evalplus"] * 4 + [None]
    assert problems[-1].verifier["kind"] == "check"  # the base asserts, run as written

    cases = [(p, code, want, row)
             for p, row, cands in zip(problems, rows, [c[3] for c in MBPP_PLUS.values()] + [HELPER])
             for code, want in cands.items()]
    results = sandbox.execute([code_job(p.verifier, code) for p, code, _, _ in cases])
    for (p, code, want, row), res in zip(cases, results):
        official_test = row["test"] if p.verifier.get("compare") else \
            "\n".join(row["test_imports"]) + "\n" + "\n".join(row["test_list"])
        official = _official(["-c", code + "\n" + official_test])
        assert official is want, (p.problem_id, code)  # the hand-made case is what it claims to be
        assert code_passes(p.verifier, res) is official, (p.problem_id, code, res.status, res.outputs)


def test_mbppplus_evalplus_release_compares_with_reference_values(tmp_path, sandbox):
    """The evalplus release format carries no expected values: they come from the reference run in the
    sandbox, typed, and the comparison is evalplus's (a list is not the reference's tuple)."""
    from sage.engines.data.code_jobs import complete_code_verifiers

    row = {"task_id": "Mbpp/7", "prompt": "Pair a and b.", "entry_point": "pair",
           "canonical_solution": "def pair(a, b):\n    return (a, b)\n", "base_input": [[1, 2]], "plus_input": [[3, 4]],
           "atol": 0}
    (tmp_path / "MbppPlus.jsonl").write_text(json.dumps(row) + "\n")
    (p,) = complete_code_verifiers(load_benchmark("mbppplus", path=tmp_path / "MbppPlus.jsonl"), sandbox)
    assert expected_of(p.verifier) == [(1, 2), (3, 4)] and type(expected_of(p.verifier)[0]) is tuple
    tup, lst = sandbox.execute([code_job(p.verifier, "def pair(a, b):\n    return (a, b)\n"),
                                code_job(p.verifier, "def pair(a, b):\n    return [a, b]\n")])
    assert code_passes(p.verifier, tup) is True and code_passes(p.verifier, lst) is False
    assert score_outputs(expected_of(p.verifier), lst)[0] == 1.0  # where generated tasks' JSON level differs


def test_livecodebench_verdicts_match_its_grader(tmp_path, sandbox):
    row = {"question_title": "Flip", "question_content": "Reverse the pair.", "platform": "leetcode",
           "question_id": "4000", "contest_date": "2024-01-01", "difficulty": "easy",
           "starter_code": "class Solution:\n    def flip(self, xs: List[int]) -> List[int]:\n        ",
           "public_test_cases": json.dumps(LCB_TESTS[:1]), "private_test_cases": json.dumps(LCB_TESTS[1:]),
           "metadata": json.dumps({"func_name": "flip"})}
    (tmp_path / "lcb.jsonl").write_text(json.dumps(row) + "\n")
    (p,) = load_benchmark("livecodebench", path=tmp_path / "lcb.jsonl")
    assert p.verifier["compare"] == "livecodebench"
    results = sandbox.execute([code_job(p.verifier, code) for code in LCB])
    stdin = [[t["input"] for t in LCB_TESTS], [t["output"] for t in LCB_TESTS]]
    for (code, want), res in zip(LCB.items(), results):
        official = _official(["-c", LCB_OFFICIAL], json.dumps([code, "flip", *stdin]))
        assert official is want, code
        assert code_passes(p.verifier, res) is official, (code, res.status, res.outputs)
    near_miss = results[3]  # JSON-level equality (generated tasks) would have credited it
    assert score_outputs(expected_of(p.verifier), near_miss)[0] == 1.0


def test_unknown_compare_is_a_clear_error(sandbox):
    verifier = {"entry_point": "f", "inputs": [[1]], "outputs": [1], "compare": "exact-ish"}
    res = sandbox.execute([code_job(verifier, "def f(x):\n    return x\n")])[0]
    with pytest.raises(ValueError, match="unknown compare 'exact-ish'"):
        code_passes(verifier, res)


def test_livecodebench_stdin_verdicts_match_its_grader(tmp_path, sandbox):
    row = {"question_title": "Sum", "question_content": "Print the sum, then one half.", "platform": "atcoder",
           "question_id": "abc999_a", "contest_date": "2024-01-01", "difficulty": "easy", "starter_code": "",
           "public_test_cases": json.dumps(LCB_STDIO_TESTS[:1]), "private_test_cases": json.dumps(LCB_STDIO_TESTS[1:]),
           "metadata": "{}"}
    (tmp_path / "lcb.jsonl").write_text(json.dumps(row) + "\n")
    (p,) = load_benchmark("livecodebench", path=tmp_path / "lcb.jsonl")
    results = sandbox.execute([code_job(p.verifier, code) for code in LCB_STDIO])
    stdin = [[t["input"] for t in LCB_STDIO_TESTS], [t["output"] for t in LCB_STDIO_TESTS]]
    for (code, want), res in zip(LCB_STDIO.items(), results):
        official = _official(["-c", LCB_STDIO_OFFICIAL], json.dumps([code, *stdin]))
        assert official is want, code
        assert code_passes(p.verifier, res) is official, (code, res.status, res.outputs)
