import json
import subprocess
import sys

import pytest

from sage.engines.data.seeds import SeedFileError, default_code, default_math, load_file
from sage.warehouse import Warehouse

GOOD_MATH = {"domain": "math", "question": "What is 2+3?", "answer": "5"}
GOOD_CODE = {"domain": "code", "question": "Write add(a, b).", "entry_point": "add",
             "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}


def _sage(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sage.flows.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_good_file_loads(tmp_path):
    items = load_file(_write_jsonl(tmp_path / "ok.jsonl", [GOOD_MATH, GOOD_CODE, dict(GOOD_MATH, split="validation")]))
    assert [i.domain for i in items] == ["math", "code", "math"]
    assert items[1].verifier == {"entry_point": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}
    assert items[2].split == "validation"


@pytest.mark.parametrize("row, message", [
    ({"domain": "math", "answer": "5"}, ":2: missing field 'question'"),
    ({"domain": "physics", "question": "q"}, ":2: unknown domain 'physics'"),
    ({"domain": "math", "question": "q"}, ":2: math problem without 'answer'"),
    (dict(GOOD_CODE, inputs="[[1, 2]"), ":2: 'inputs' is not valid JSON"),
    (dict(GOOD_CODE, inputs=[1, 2]), ":2: 'inputs' must be a non-empty list of argument lists"),
    (dict(GOOD_CODE, outputs=[3]), ":2: 1 outputs for 2 inputs"),
    ({k: v for k, v in GOOD_CODE.items() if k != "outputs"}, ":2: code problem needs 'outputs' or a reference"),
    (dict(GOOD_CODE, entry_point="not a name"), ":2: code problem needs 'entry_point'"),
    (dict(GOOD_CODE, solution="def add(a, b) return"), ":2: 'solution' does not parse"),
])
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    path = _write_jsonl(tmp_path / "bad.jsonl", [GOOD_MATH, row])
    with pytest.raises(SeedFileError) as e:
        load_file(path)
    assert str(path) + message in str(e.value)


def test_bad_files(tmp_path):
    (tmp_path / "latin1.jsonl").write_bytes(b'{"domain": "math", "question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(SeedFileError, match=r"latin1.jsonl:1: not UTF-8"):
        load_file(tmp_path / "latin1.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SeedFileError, match="no problems in the file"):
        load_file(tmp_path / "empty.jsonl")
    (tmp_path / "broken.jsonl").write_text(json.dumps(GOOD_MATH) + "\n{not json\n")
    with pytest.raises(SeedFileError, match=r"broken.jsonl:2: not valid JSON"):
        load_file(tmp_path / "broken.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(SeedFileError, match="unsupported file type"):
        load_file(tmp_path / "x.csv")


def test_parquet_file(tmp_path):
    import pandas as pd

    path = tmp_path / "p.parquet"
    pd.DataFrame([dict(GOOD_CODE, inputs=json.dumps(GOOD_CODE["inputs"]), outputs=json.dumps(GOOD_CODE["outputs"])),
                  dict(GOOD_MATH, inputs=None, outputs=None, entry_point=None)]).to_parquet(path)
    items = load_file(path)
    assert items[0].verifier["inputs"] == [[1, 2], [3, 4]] and items[1].verifier == {"answer": "5"}


def test_default_sets_are_disjoint_and_deterministic():
    seeds, val = default_math(30, 0, "seed"), default_math(30, 0, "validation")
    assert len(seeds) == 30 and {i.question for i in seeds}.isdisjoint({i.question for i in val})
    assert [i.question for i in default_math(30, 0, "seed")] == [i.question for i in seeds]
    code_s, code_v = default_code(20, 0, "seed"), default_code(20, 0, "validation")
    assert {i.solution for i in code_s}.isdisjoint({i.solution for i in code_v})
    assert all(i.verifier["entry_point"] == "main_solution" for i in code_s)


def test_bad_file_via_cli_writes_nothing(tmp_path):
    bad = _write_jsonl(tmp_path / "bad.jsonl", [GOOD_MATH, {"domain": "math"}])
    r = _sage("seed", "--set", f"seeds.source={bad}", "--set", f"run.dir={tmp_path}")
    assert r.returncode == 2 and "bad.jsonl:2" in r.stderr and "nothing was written" in r.stderr
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.count("questions") == 0


def test_user_file_with_solution_computes_outputs_in_sandbox(tmp_path):
    rows = [GOOD_MATH, {"domain": "code", "question": "Square x.", "entry_point": "sq", "inputs": [[2], [5]],
                        "solution": "def sq(x):\n    return x * x\n"}]
    src = _write_jsonl(tmp_path / "mine.jsonl", rows)
    r = _sage("seed", "--set", f"seeds.source={src}", "--set", f"run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        got = wh.rows("SELECT verifier->'$.outputs' AS o FROM questions WHERE domain = 'code'")
    assert json.loads(got[0]["o"]) == [4, 25]


def test_default_seed_twice_same_counts(tmp_path):
    args = ["seed", "--set", f"run.dir={tmp_path}", "--set", "seeds.n_math=12", "--set", "seeds.n_code=4",
            "--set", "validate.n_math=6", "--set", "validate.n_code=3"]
    first = _sage(*args)
    assert first.returncode == 0, first.stderr
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        counts1 = wh.rows("SELECT origin, domain, count(*) AS n FROM questions GROUP BY ALL ORDER BY ALL")
        outputs = wh.rows("SELECT verifier FROM questions WHERE domain = 'code'")
    assert {(c["origin"], c["domain"]): c["n"] for c in counts1} == {
        ("seed", "math"): 12, ("seed", "code"): 4, ("validation", "math"): 6, ("validation", "code"): 3}
    for row in outputs:
        v = json.loads(row["verifier"])
        assert len(v["inputs"]) == len(v["outputs"]) > 0
    second = _sage(*args)
    assert second.returncode == 0 and "nothing to do" in second.stdout
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.rows("SELECT origin, domain, count(*) AS n FROM questions GROUP BY ALL ORDER BY ALL") == counts1
