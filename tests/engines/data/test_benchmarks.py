"""Benchmark loaders on small local files of each dataset's real format, the offline sets shipped in
packages, the code-verifier jobs run in the real sandbox, and pass@k against hand-computed values."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pandas as pd
import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.data import benchmarks
from sage.engines.data.benchmarks import BenchmarkUnavailable, decode_lcb_tests, load_benchmark, pass_at_k
from sage.engines.data.code_jobs import code_job, code_passes, complete_code_verifiers, expected_of
from sage.engines.verify.outputs import score_outputs
from sage.engines.verify.sandbox import Sandbox


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(timeout_s=20, cpu_s=10, workers=2))


# -- pass@k ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),          # c / n
    (5, 2, 2, 0.7),          # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 0, 3, 0.0),
    (5, 4, 2, 1.0),          # n - c < k: every k-subset holds a correct sample
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (1, 1, 1, 1.0),
])
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_large_n_and_bad_arguments():
    assert pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000)
    assert 0.0 < pass_at_k(5000, 3, 100) < 1.0
    for bad in [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


# -- offline sets ------------------------------------------------------------------------------------------

def test_offline_counts_and_shapes():
    he = load_benchmark("humaneval")
    assert len(he) == 164 and he[0].problem_id == "HumanEval/0" and he[0].domain == "code"
    assert he[0].verifier["kind"] == "check" and he[0].verifier["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in he[0].verifier["check"] and "outputs" not in he[0].verifier
    assert he[0].verifier["reference"].startswith(he[0].question)
    m500, aime = load_benchmark("math500"), load_benchmark("aime")
    assert len(m500) == 311 and len(aime) == 45
    assert sum(p.problem_id.startswith("aime2024/") for p in aime) == 30
    assert all(p.domain == "math" and p.verifier["answer"] and "$" not in p.verifier["answer"] for p in m500 + aime)
    assert aime[0].verifier == {"answer": "204"}  # AIME 2024 I problem 1
    assert len({p.problem_id for p in m500 + aime}) == 356
    assert len(load_benchmark("math500", limit=7)) == 7


def test_unknown_benchmark_and_unreachable_hub(monkeypatch):
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("nope")
    conv, _, _, fields = benchmarks.HUB["gsm8k"]
    monkeypatch.setitem(benchmarks.HUB, "gsm8k", (conv, ("sage-test/no-such-dataset",), {"split": "test"}, fields))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BenchmarkUnavailable, match="pass path="):
        load_benchmark("gsm8k")


# -- hub sets from local files -----------------------------------------------------------------------------

def test_gsm8k_jsonl_and_parquet(tmp_path):
    rows = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
            {"question": "A car costs ...", "answer": "It costs 1,200 dollars.\n#### 1,200"}]
    a = load_benchmark("gsm8k", path=write_jsonl(tmp_path / "g.jsonl", rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "g.parquet")
    b = load_benchmark("gsm8k", path=tmp_path / "g.parquet")
    assert a == b
    assert [p.verifier for p in a] == [{"answer": "7"}, {"answer": "1200"}]
    assert a[0].question == rows[0]["question"] and a[1].problem_id == "gsm8k/1" and a[0].domain == "math"
    with pytest.raises(BenchmarkUnavailable, match="missing fields"):
        load_benchmark("gsm8k", path=write_jsonl(tmp_path / "x.jsonl", [{"problem": "p", "solution": "s"}]))
    with pytest.raises(BenchmarkUnavailable, match="no such file"):
        load_benchmark("gsm8k", path=tmp_path / "missing.jsonl")


def test_olympiadbench_parquet(tmp_path):
    rows = [
        {"id": 1606, "question": "Find the smallest $n$ such that ...", "solution": ["..."], "final_answer": ["$5$"],
         "context": None, "image_1": None, "modality": "Text-only", "difficulty": "Competition",
         "is_multiple_answer": False, "unit": None, "answer_type": "Numerical", "error": None,
         "question_type": "Open-ended", "subfield": "Combinatorics", "subject": "Math", "language": "English"},
        {"id": 1607, "question": "Find all pairs ...", "solution": ["..."], "final_answer": ["$(1,2)$", "$(2,1)$"],
         "context": None, "image_1": None, "modality": "Text-only", "difficulty": "Competition",
         "is_multiple_answer": True, "unit": None, "answer_type": "Tuple", "error": None,
         "question_type": "Open-ended", "subfield": "Algebra", "subject": "Math", "language": "English"},
        {"id": 9, "question": "In the figure ...", "solution": ["..."], "final_answer": ["$3$"], "context": None,
         "image_1": "<image bytes>", "modality": "Multimodal", "difficulty": "Competition",
         "is_multiple_answer": False, "unit": None, "answer_type": "Numerical", "error": None,
         "question_type": "Open-ended", "subfield": "Geometry", "subject": "Math", "language": "English"},
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "ob.parquet")
    probs = load_benchmark("olympiadbench", path=tmp_path / "ob.parquet")
    assert [p.problem_id for p in probs] == ["olympiadbench/1606", "olympiadbench/1607"]  # figure one skipped
    assert [p.verifier["answer"] for p in probs] == ["5", "(1,2), (2,1)"]
    assert probs[1].meta["is_multiple_answer"] is True and probs[0].meta["answer_type"] == "Numerical"


MBPP_TEST = """
import numpy as np

def assertion(out, exp, atol):
    assert out == exp

inputs = [[3, 4], [10, -2], [0, 0]]
results = [7, 8, 0]
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion(add_nums(*inp), exp, 0)
"""


def test_mbppplus_hub_and_evalplus_formats(tmp_path, sandbox):
    hub = [{"task_id": 2, "code": "def add_nums(a, b):\n    return a + b\n",
            "prompt": "Write a function to add two numbers.", "source_file": "x.pdf", "test_imports": [],
            "test_list": ["assert add_nums(1, 2) == 3", "assert add_nums(2, 2) == 4"], "test": MBPP_TEST},
           {"task_id": 3, "code": "def is_not_prime(n):\n    return n > 1 and any(n % k == 0 for k in range(2, n))\n",
            "prompt": "Write a python function to identify non-prime numbers.", "source_file": "x.pdf",
            "test_imports": [], "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True"],
            "test": "inputs = [[float('inf')]]\nresults = [True]\n"}]  # not literal: falls back to test_list
    pd.DataFrame(hub).to_parquet(tmp_path / "mbpp.parquet")
    a, b = load_benchmark("mbppplus", path=tmp_path / "mbpp.parquet")
    assert a.problem_id == "Mbpp/2" and "add two numbers" in a.question and "assert add_nums(1, 2) == 3" in a.question
    assert a.verifier == {"entry_point": "add_nums", "inputs": [[3, 4], [10, -2], [0, 0]], "outputs": [7, 8, 0],
                          "compare": "evalplus", "atol": 0.0}
    assert b.verifier["kind"] == "check" and b.verifier["entry_point"] == "is_not_prime"
    assert "assert is_not_prime(10) == True" in b.verifier["check"] and "outputs" not in b.verifier

    evalplus = [{"task_id": "Mbpp/4",
                 "prompt": '"""\nWrite a function to square a number.\nassert square(3) == 9\n"""\n',
                 "entry_point": "square", "canonical_solution": "def square(x):\n    return x * x\n",
                 "base_input": [[3]], "plus_input": [[-2], [0]], "atol": 0, "assertion": "assert square(3) == 9"}]
    (c,) = load_benchmark("mbppplus", path=write_jsonl(tmp_path / "MbppPlus.jsonl", evalplus))
    assert c.problem_id == "Mbpp/4" and c.verifier["inputs"] == [[3], [-2], [0]] and "outputs" not in c.verifier

    done = complete_code_verifiers([a, b, c], sandbox)
    assert [p.problem_id for p in done] == ["Mbpp/2", "Mbpp/3", "Mbpp/4"]
    assert done[1] == b and done[2].verifier["outputs"] == [9, 4, 0]  # a check verifier has nothing to fill in
    base = sandbox.execute([code_job(b.verifier, b.verifier["reference"]),
                            code_job(b.verifier, "def is_not_prime(n):\n    return n % 2 == 1\n")])
    assert [code_passes(b.verifier, r) for r in base] == [True, False]
    assert "outputs" not in c.verifier  # the caller's problems are not modified
    s_gt, passed = score_outputs(expected_of(done[2].verifier), sandbox.execute(
        [code_job(done[2].verifier, "def square(x):\n    return abs(x) * 3\n")])[0])
    assert passed == [True, False, True] and s_gt == pytest.approx(2 / 3)


def encode_private(tests: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def test_livecodebench_stdin_and_functional(tmp_path, sandbox):
    stdin_row = {
        "question_title": "Sum", "question_content": "Given N and N integers, print their sum.",
        "platform": "atcoder", "question_id": "abc300_a", "contest_id": "abc300", "contest_date": "2023-04-29",
        "starter_code": "", "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]),
        "private_test_cases": encode_private([{"input": "2\n-5 5\n", "output": "0\n", "testtype": "stdin"},
                                              {"input": "1\n7\n", "output": "7\n", "testtype": "stdin"}]),
        "metadata": "{}"}
    func_row = {
        "question_title": "Two Sum", "question_content": "Return indices of the two numbers adding to target.",
        "platform": "leetcode", "question_id": "3000", "contest_id": "weekly-contest-1", "contest_date": "2023-05-01",
        "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
        "difficulty": "medium",
        "public_test_cases": json.dumps([{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"}]),
        "private_test_cases": json.dumps([{"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "twoSum"})}
    s, f = load_benchmark("livecodebench", path=write_jsonl(tmp_path / "lcb.jsonl", [stdin_row, func_row]))
    assert s.problem_id == "abc300_a" and s.meta["platform"] == "atcoder" and s.domain == "code"
    assert s.verifier == {"kind": "stdin", "tests": [["3\n1 2 3\n", "6\n"], ["2\n-5 5\n", "0\n"], ["1\n7\n", "7\n"]],
                          "compare": "livecodebench-stdio"}
    assert f.verifier == {"entry_point": "twoSum", "method_of": "Solution",
                          "inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6]],
                          "outputs": [[0, 1], [1, 2]], "compare": "livecodebench"}
    assert "class Solution" in f.question
    assert decode_lcb_tests(stdin_row["private_test_cases"])[0]["input"] == "2\n-5 5\n"
    with pytest.raises(pickle.UnpicklingError):  # a pickle that names any global is refused, never run
        decode_lcb_tests(base64.b64encode(zlib.compress(pickle.dumps(print))).decode())

    good_stdin = "import sys\nn = int(input())\nprint(sum(map(int, sys.stdin.readline().split())))   \n"
    wrong_stdin = "n = int(input())\nxs = list(map(int, input().split()))\nprint(max(xs))\nexit(0)\nprint('never')\n"
    good_func = ("class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
                 "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
                 "                return [seen[target - x], i]\n            seen[x] = i\n")
    jobs = [code_job(s.verifier, good_stdin), code_job(s.verifier, wrong_stdin), code_job(f.verifier, good_func)]
    results = sandbox.execute(jobs)
    assert expected_of(s.verifier) == ["6", "0", "7"]
    assert score_outputs(expected_of(s.verifier), results[0]) == (1.0, [True, True, True])
    assert score_outputs(expected_of(s.verifier), results[1]) == (pytest.approx(1 / 3), [False, False, True])
    assert score_outputs(expected_of(f.verifier), results[2]) == (1.0, [True, True])


def test_humaneval_is_scored_by_its_check_not_reference_outputs(sandbox):
    by_id = {p.problem_id: p for p in load_benchmark("humaneval")}
    picked = [by_id["HumanEval/0"], by_id["HumanEval/32"]]  # /32 builds its inputs in a loop
    assert complete_code_verifiers(picked, sandbox) == picked  # nothing to fill in
    results = sandbox.execute([code_job(p.verifier, p.verifier["reference"]) for p in picked])
    assert [code_passes(p.verifier, r) for p, r in zip(picked, results)] == [True, True]
    with pytest.raises(ValueError, match="complete_code_verifiers"):
        expected_of({"entry_point": "f", "inputs": [[1]], "reference": "def f(x): return x"})
