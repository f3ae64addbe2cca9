"""`seeds.sets`: seed and validation problems from published datasets' local files in their own formats (MATH,
GSM8K, HumanEval, MBPP; small fixture files here), drawn disjointly, code outputs from the reference solutions in
the real sandbox; a missing file fails the seed stage (not the config) with what to download and where to put it."""

from __future__ import annotations

import json

import pytest

from sage.configs import ConfigError, load_config
from sage.engines.data.seeds import SeedFileError, set_item, set_items
from sage.stages import seed
from sage.stages.context import StageContext
from sage.warehouse import Warehouse

MATH = [{"problem": f"What is ${k} + {k}$?", "level": "Level 1", "type": "Prealgebra",
         "solution": f"Adding, ${k} + {k} = \\boxed{{{2 * k}}}$."} for k in range(1, 7)]
MATH.append({"problem": "Prove that 2 is prime.", "level": "Level 1", "type": "Number Theory",
             "solution": "Its only divisors are 1 and 2."})                     # no \boxed{}: nothing to check
MATH += [  # answers in several boxes, and in \fbox: the whole answer, as the verifier's extract_answer reads it
    {"problem": "Solve $x^2 = 1$.", "level": "Level 2", "type": "Algebra",
     "solution": "So $x = \\pm 1$, that is $\\boxed{-1}, \\boxed{1}$."},
    {"problem": "Solve $(x-2)(x-5) = 0$.", "level": "Level 2", "type": "Algebra",
     "solution": "Either $x=\\boxed{2}$ or $x=\\boxed{5}$."},
    {"problem": "What is $3 + 4$?", "level": "Level 1", "type": "Prealgebra",
     "solution": "Adding gives $\\fbox{7}$."}]
ANSWERS = {**{f"What is ${k} + {k}$?": str(2 * k) for k in range(1, 7)}, "Solve $x^2 = 1$.": "-1, 1",
           "Solve $(x-2)(x-5) = 0$.": "2, 5", "What is $3 + 4$?": "7"}
GSM8K = [{"question": "Ann has 3 boxes of 400 pens. How many pens?",
          "answer": "3 * 400 = <<3*400=1200>>1200\n#### 1,200"},
         {"question": "Bo reads 5 pages a day for 4 days. How many pages?", "answer": "5 * 4 = 20\n#### 20"}]
HUMANEVAL = [
    {"task_id": "HumanEval/0", "entry_point": "add", "prompt": 'def add(a: int, b: int) -> int:\n    """Add."""\n',
     "canonical_solution": "    return a + b\n",
     "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"
             "    assert candidate(0, 5) == 5\n"},
    {"task_id": "HumanEval/32", "entry_point": "neg", "prompt": 'def neg(x: int) -> int:\n    """Negate."""\n',
     "canonical_solution": "    return -x\n",   # inputs built in a loop: no literal call to take them from
     "test": "\n\ndef check(candidate):\n    for x in range(3):\n        assert candidate(x) == -x\n"}]
MBPP = [  # the original release's fields (text, code, test_list, test_setup_code)
    {"task_id": 601, "text": "Write a function to square a number.", "code": "def square(n):\n    return n * n",
     "test_list": ["assert square(3) == 9", "assert square(-2) == 4"], "test_setup_code": "",
     "challenge_test_list": []},
    {"task_id": 602, "text": "Write a function to halve a number.", "code": "def half(n):\n    return n / 0",
     "test_list": ["assert half(4) == 2"], "test_setup_code": "", "challenge_test_list": []},   # its reference fails
    {"task_id": 603, "text": "Write a function to count the words of a string.",
     "code": "def count_words(s):\n    return len(s.split())",
     "test_list": ["assert count_words('a b') == 2", "assert count_words('') == 0"], "test_setup_code": "",
     "challenge_test_list": []}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def files(tmp_path):
    import pandas as pd

    gsm8k = tmp_path / "gsm8k-train.parquet"
    pd.DataFrame(GSM8K).to_parquet(gsm8k)
    mbpp_sanitized = tmp_path / "mbpp-sanitized.parquet"   # the sanitized release: prompt, test_imports
    pd.DataFrame([{"source_file": "x", "task_id": 11, "prompt": "Write a function to cube a number.",
                   "code": "def cube(n):\n    return n ** 3", "test_imports": [],
                   "test_list": ["assert cube(2) == 8", "assert cube(3) == 27"]}]).to_parquet(mbpp_sanitized)
    return {"math": _jsonl(tmp_path / "math.jsonl", MATH), "gsm8k": str(gsm8k),
            "humaneval": _jsonl(tmp_path / "HumanEval.jsonl", HUMANEVAL), "mbpp": _jsonl(tmp_path / "mbpp.jsonl", MBPP),
            "mbpp_sanitized": str(mbpp_sanitized)}


def _cfg(tmp_path, sets, *extra):
    return load_config("cpu", [f"run.dir={tmp_path}", f"seeds.sets={json.dumps(sets)}", "sandbox.timeout_s=3", *extra])


def test_each_format_becomes_a_problem_the_verifiers_read(files):
    math = set_items("math", files["math"], 0)
    assert len(math) == 9 and all(i.domain == "math" for i in math)              # the unboxed proof is left out
    assert {i.question: i.verifier["answer"] for i in math} == ANSWERS           # every box, \fbox too
    gsm = {i.question: i.verifier["answer"] for i in set_items("gsm8k", files["gsm8k"], 0)}
    assert gsm[GSM8K[0]["question"]] == "1200"                                  # `#### 1,200`
    [add] = set_items("humaneval", files["humaneval"], 0)                         # HumanEval/32 has no literal inputs
    assert add.verifier == {"entry_point": "add", "inputs": [[1, 2], [0, 5]]} and add.source == "humaneval:HumanEval/0"
    assert add.solution and add.solution.startswith("def add(") and "return a + b" in add.solution
    square = set_item("mbpp", "mbpp:1", MBPP[0], "seed")
    assert square is not None and square.verifier == {"entry_point": "square", "inputs": [[3], [-2]]}
    assert square.question.startswith(MBPP[0]["text"]) and "assert square(3) == 9" in square.question
    [cube] = set_items("mbpp", files["mbpp_sanitized"], 0)
    assert cube.verifier == {"entry_point": "cube", "inputs": [[2], [3]]}
    assert [i.question for i in set_items("math", files["math"], 0)] == [i.question for i in math]   # seeded order
    assert [i.question for i in set_items("math", files["math"], 1)] != [i.question for i in math]


def test_sets_draw_disjoint_rows_and_code_outputs_in_the_sandbox(tmp_path, files):
    sets = [{"dataset": "math", "path": files["math"], "n": 4},
            {"dataset": "mbpp", "path": files["mbpp"], "n": 2},
            {"dataset": "humaneval", "path": files["humaneval"], "n": 1},
            {"dataset": "math", "path": files["math"], "n": 2, "split": "validation"},
            {"dataset": "gsm8k", "path": files["gsm8k"], "n": 1, "split": "validation"}]
    ctx = StageContext(_cfg(tmp_path, sets), None)
    try:
        items, dropped = seed.draw_sets(ctx)
    finally:
        ctx.close()
    seeds = [i for i in items if i.split == "seed"]
    val = [i for i in items if i.split == "validation"]
    assert [i.domain for i in seeds] == ["math"] * 4 + ["code"] * 3 and len(val) == 3
    assert {i.question for i in seeds}.isdisjoint({i.question for i in val})        # one file, disjoint rows
    assert len({i.question for i in items if i.source == "math"}) == 6                # 4 + 2 distinct rows
    outputs = {i.verifier["entry_point"]: i.verifier["outputs"] for i in seeds if i.domain == "code"}
    assert outputs == {"square": [9, 4], "count_words": [2, 0], "add": [3, 5]}      # from the references, run
    assert [(i.verifier["entry_point"], why.split(" (")[0]) for i, why in dropped] == [
        ("half", "the reference solution failed")]                                # reported; the set drew another


def test_the_seed_stage_writes_them_once(tmp_path, files):
    sets = [{"dataset": "gsm8k", "path": files["gsm8k"], "n": 1},
            {"dataset": "gsm8k", "path": files["gsm8k"], "n": 1, "split": "validation"},
            {"dataset": "mbpp", "path": files["mbpp"], "n": 1, "split": "validation"}]
    wh = Warehouse.open(tmp_path / "w.duckdb")
    ctx = StageContext(_cfg(tmp_path, sets), wh)
    try:
        first = seed.run(ctx)
        again = seed.run(ctx)
    finally:
        ctx.close()
    rows = wh.execute("SELECT origin, domain, source FROM questions ORDER BY origin, domain")
    wh.close()
    assert first.rows_out == 3 and again.rows_out == 0
    assert [(o, d) for o, d, _ in rows] == [("seed", "math"), ("validation", "code"), ("validation", "math")]
    assert first.info["seed_math"] == 1 and first.info["validation_code"] == 1


def test_a_file_with_too_few_usable_rows_names_the_set(tmp_path, files):
    sets = [{"dataset": "mbpp", "path": files["mbpp"], "n": 3}]          # one of its three references fails
    ctx = StageContext(_cfg(tmp_path, sets), None)
    try:
        with pytest.raises(ConfigError, match=r"mbpp \(.*mbpp.jsonl\) has 2 usable problems left for the seed set, "
                                              r"which asks for n=3; lower n"):
            seed.draw_sets(ctx)
    finally:
        ctx.close()


def test_a_file_of_another_format_is_refused(tmp_path, files):
    with pytest.raises(SeedFileError, match=r"math.jsonl:1: not a gsm8k file \(no field question, answer\)"):
        set_items("gsm8k", files["math"], 0)


def test_paper_7b_loads_without_its_files_and_the_seed_stage_says_what_to_download(tmp_path):
    cfg = load_config("paper-7b", [f"run.dir={tmp_path}"])                  # config load: no file is looked at
    assert [s.dataset for s in cfg.seeds.sets] == ["math", "gsm8k", "humaneval", "mbpp", "math", "gsm8k", "mbpp"]
    assert sum(s.n for s in cfg.seeds.sets if s.split == "seed") == 500                              # SAGE.md
    assert sum(s.n for s in cfg.seeds.sets if s.split == "validation") == 100
    ctx = StageContext(cfg, None)
    try:
        with pytest.raises(SeedFileError) as e:
            seed.draw_sets(ctx)
    finally:
        ctx.close()
    message = str(e.value)
    assert "the math file sage-data/math-train.parquet does not exist" in message
    assert "Download Hendrycks MATH, train split" in message and "Nothing is downloaded at run time" in message


def test_sets_and_a_source_file_are_one_or_the_other(files):
    with pytest.raises(ConfigError, match="seeds.sets and seeds.source"):
        load_config("cpu", [f"seeds.sets={json.dumps([{'dataset': 'gsm8k', 'path': files['gsm8k'], 'n': 1}])}",
                            "seeds.source=x.jsonl"])
    with pytest.raises(ConfigError, match="a math seed set needs `path`"):
        load_config("cpu", ['seeds.sets=[{"dataset": "math", "n": 1}]'])


def test_a_bad_row_is_skipped_and_reported_with_its_file_and_line(tmp_path, caplog):
    bad = [{"task_id": 604, "text": "Write f.", "code": "def f(n):\n    return n",
            "test_list": ["assert f(1) == 1", "assert f(2) == 2 =="]},          # a test that does not parse
           {"task_id": 605, "text": "Write g.", "test_list": ["assert g(1) == 1"]}]   # no reference code
    path = _jsonl(tmp_path / "mbpp.jsonl", [MBPP[0], *bad, MBPP[2]])
    with caplog.at_level("WARNING", logger="sage.engines.data.seeds"):
        items = set_items("mbpp", path, 0)                                     # was a bare SyntaxError
    logged = [r.getMessage() for r in caplog.records]
    skipped: list = []
    assert set_items("mbpp", path, 0, skipped) == items
    assert sorted(i.verifier["entry_point"] for i in items) == ["count_words", "square"]   # the good rows stay
    assert [(i.where, why) for i, why in skipped] == [
        (f"{path}:2", "its tests do not parse: invalid syntax (line 2)"),
        (f"{path}:3", "not a mbpp row (no field code)")]
    assert logged == [f"{path}:2: skipped (its tests do not parse: invalid syntax (line 2))",
                      f"{path}:3: skipped (not a mbpp row (no field code))"]
    ctx = StageContext(_cfg(tmp_path, [{"dataset": "mbpp", "path": path, "n": 2}]), None)
    try:
        drawn, dropped = seed.draw_sets(ctx)                                   # the seed stage reports them too
    finally:
        ctx.close()
    assert len(drawn) == 2 and [i.where for i, _ in dropped] == [f"{path}:2", f"{path}:3"]
