"""The one reader of local problem files (JSONL, JSON, Parquet) behind seed files and benchmark files, and
the error each caller turns its failures into: SeedFileError naming file and line, BenchmarkUnavailable."""

from __future__ import annotations

import json

import pytest

from sage.engines.data.benchmarks import BenchmarkUnavailable, load_benchmark
from sage.engines.data.files import RowFileError, read_records
from sage.engines.data.seeds import SeedFileError, load_file

pytestmark = pytest.mark.fast

MATH = {"domain": "math", "question": "What is 2+3?", "answer": "5"}
GSM = {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}


def test_jsonl_json_and_parquet_rows_with_where_they_came_from(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text(json.dumps(MATH) + "\n\n" + json.dumps(GSM) + "\n")
    assert read_records(tmp_path / "a.jsonl") == [(f"{tmp_path}/a.jsonl:1", MATH), (f"{tmp_path}/a.jsonl:3", GSM)]
    (tmp_path / "b.json").write_text(json.dumps([MATH, GSM], indent=1))
    assert read_records(tmp_path / "b.json") == [(f"{tmp_path}/b.json:row 1", MATH), (f"{tmp_path}/b.json:row 2", GSM)]
    (tmp_path / "c.json").write_text(json.dumps(MATH) + "\n")  # JSONL under a .json name
    assert read_records(tmp_path / "c.json") == [(f"{tmp_path}/c.json:1", MATH)]
    pq.write_table(pa.table({"question": ["q1", None], "answer": [None, 7]}), tmp_path / "d.parquet")
    assert read_records(tmp_path / "d.parquet") == [(f"{tmp_path}/d.parquet:row 1", {"question": "q1", "answer": None}),
                                                    (f"{tmp_path}/d.parquet:row 2", {"question": None, "answer": 7})]


def test_parquet_missing_values_are_none_not_nan(tmp_path):
    """pandas would read the missing answer as NaN, and a seed check would take 'nan' for an answer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "seeds.parquet"
    pq.write_table(pa.table({"domain": ["math", "math"], "question": ["q1", "q2"], "answer": [1.5, None]}), path)
    with pytest.raises(SeedFileError, match=r"seeds.parquet:row 2: math problem without 'answer'"):
        load_file(path)


@pytest.mark.parametrize("name, content, message", [
    ("missing.jsonl", None, r"missing.jsonl: no such file"),
    ("x.csv", "a,b\n", r"x.csv: unsupported file type '.csv'; use .jsonl, .json or .parquet"),
    ("latin1.jsonl", b'{}\n{"question": "caf\xe9"}\n', r"latin1.jsonl:2: not UTF-8 text \(byte 20\)"),
    ("broken.jsonl", json.dumps(GSM) + "\n{not json\n", r"broken.jsonl:2: not valid JSON \(.*\); one object per line"),
    ("broken.json", "[\n" + json.dumps(GSM) + ",\n{not json]", r"broken.json:3: not valid JSON"),
    ("bad.parquet", "not parquet", r"bad.parquet: not a readable Parquet file"),
])
def test_each_caller_keeps_its_error_type(tmp_path, name, content, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(RowFileError, match=message):
        read_records(path)
    with pytest.raises(SeedFileError, match=message):
        load_file(path)
    with pytest.raises(BenchmarkUnavailable, match=message):
        load_benchmark("gsm8k", path=path)


def test_json_list_file_loads_as_seeds_and_benchmark(tmp_path):
    seeds = tmp_path / "seeds.json"
    seeds.write_text(json.dumps([MATH, {"domain": "math", "question": "q"}]))
    with pytest.raises(SeedFileError, match=r"seeds.json:row 2: math problem without 'answer'"):
        load_file(seeds)
    seeds.write_text(json.dumps([MATH, MATH]))
    assert [i.verifier for i in load_file(seeds)] == [{"answer": "5"}] * 2
    bench = tmp_path / "gsm.json"
    bench.write_text(json.dumps([GSM]))
    assert [p.verifier for p in load_benchmark("gsm8k", path=bench)] == [{"answer": "5"}]
