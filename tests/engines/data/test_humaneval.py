"""HumanEval positive controls through the project's code verifier (Sandbox + score_outputs): all 164
canonical solutions pass and all 164 `pass` stubs fail, with expected outputs computed by running the
canonical solutions in the sandbox (never read from the asserts). One job per task holds all its inputs."""

from __future__ import annotations

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.data.humaneval import (
    expected_outputs,
    literal_inputs,
    load_humaneval,
    record_missing_inputs,
    task_job,
)
from sage.engines.verify.outputs import score_outputs
from sage.engines.verify.sandbox import Sandbox


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(timeout_s=20, cpu_s=20, workers=4))


@pytest.fixture(scope="module")
def tasks(sandbox):
    return record_missing_inputs(load_humaneval(), sandbox)


@pytest.fixture(scope="module")
def expected(tasks, sandbox):
    return expected_outputs(tasks, sandbox)


def test_load_humaneval_shape():
    tasks = load_humaneval()
    assert len(tasks) == 164 and len({t["task_id"] for t in tasks}) == 164
    for t in tasks:
        assert {"task_id", "prompt", "entry_point", "canonical_solution", "inputs"} <= set(t)
        assert t["canonical_solution"].startswith(t["prompt"]) and f"def {t['entry_point']}" in t["prompt"]
    # only the three tasks whose tests build inputs in loops have no literal calls
    assert sorted(t["task_id"] for t in tasks if not t["inputs"]) == ["HumanEval/32", "HumanEval/38", "HumanEval/50"]
    assert len(load_humaneval(limit=5)) == 5


def test_literal_inputs():
    code = ("def check(candidate):\n    assert candidate([1, 2], 'a') == 3\n    assert candidate(x) == 1\n"
            "    assert candidate((1,), {2: 3}) is None\n    assert candidate([1, 2], 'a') == 3\n"
            "    for i in range(3):\n        assert candidate(i)\n    assert abs(candidate(-1.5) - 2) < 1e-6\n")
    assert literal_inputs(code) == [[[1, 2], "a"], [(1,), {2: 3}], [-1.5]]


def test_missing_inputs_are_recorded(tasks):
    assert all(t["inputs"] for t in tasks)
    by_id = {t["task_id"]: t for t in tasks}
    assert len(by_id["HumanEval/32"]["inputs"]) >= 50 and len(by_id["HumanEval/38"]["inputs"]) >= 50


def test_canonical_solutions_all_pass(tasks, expected, sandbox):
    assert all(e is not None for e in expected), [t["task_id"] for t, e in zip(tasks, expected) if e is None]
    results = sandbox.execute([task_job(t) for t in tasks])
    scores = [score_outputs(e, r)[0] for e, r in zip(expected, results)]
    assert scores == [1.0] * 164, [t["task_id"] for t, s in zip(tasks, scores) if s != 1.0]
    assert all(r.backend == sandbox.backend for r in results)


def test_pass_stubs_all_fail(tasks, expected, sandbox):
    results = sandbox.execute([task_job(t, t["prompt"] + "    pass\n") for t in tasks])
    scores = [score_outputs(e, r)[0] for e, r in zip(expected, results)]
    assert all(s < 1.0 for s in scores), [t["task_id"] for t, s in zip(tasks, scores) if s >= 1.0]
    # a stub only "passes" the inputs whose expected output is None
    for e, r in zip(expected, results):
        assert score_outputs(e, r)[1] == [x is None for x in e]
