import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from sage.configs import ConfigError
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
    assert not (tmp_path / "warehouse.duckdb").exists()  # checked before the warehouse is made


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


BROKEN = [  # code problems whose reference solution cannot give outputs, each for its own reason
    {"domain": "code", "question": "Write boom(x).", "entry_point": "boom", "inputs": [[1]],
     "solution": "def boom(x):\n    raise ValueError('no')\n"},
    {"domain": "code", "question": "Write hang(x).", "entry_point": "hang", "inputs": [[1]],
     "solution": "def hang(x):\n    while True:\n        pass\n"},
    {"domain": "code", "question": "Write other(x).", "entry_point": "missing", "inputs": [[1]],
     "solution": "def other(x):\n    return x\n"},
]


def test_unusable_code_problems_are_reported_and_refused(tmp_path):
    """A seed file whose reference solutions raise, hang or lack the entry point: every such row is named with
    file, line and reason, the command fails and nothing is written; --skip-bad loads the rest and says what
    it skipped."""
    path = _write_jsonl(tmp_path / "s.jsonl", [GOOD_MATH, *BROKEN, GOOD_CODE])
    base = ["seed", "--set", f"run.dir={tmp_path}", "--set", f"seeds.source={path}", "--set", "sandbox.timeout_s=2",
            "--set", "sandbox.cpu_s=2"]
    r = _sage(*base)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 2 and "Traceback" not in out, out[-2000:]
    assert "3 code problem(s)" in out and "nothing was written" in out and "--skip-bad" in out
    assert f"{path}:2: the reference solution failed (error: ValueError: no)" in out
    assert f"{path}:3: the reference solution failed (timeout" in out
    assert f"{path}:4: the reference solution failed" in out
    assert not (tmp_path / "warehouse.duckdb").exists()  # made for the seed stage, removed when it failed
    r = _sage(*base, "--skip-bad")
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, out[-2000:]
    assert "2 new question(s) of 5 loaded" in out and f"skipped {path}:3" in out
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT count(*) FROM questions") == 2


def test_an_edited_seed_file_loads_its_new_rows(tmp_path):
    path = _write_jsonl(tmp_path / "s.jsonl", [GOOD_MATH])
    base = ["seed", "--set", f"run.dir={tmp_path}", "--set", f"seeds.source={path}"]
    assert _sage(*base).returncode == 0
    _write_jsonl(path, [GOOD_MATH, dict(GOOD_MATH, question="What is 4+4?", answer="8")])
    r = _sage(*base)
    assert r.returncode == 0 and "1 new question(s) of 2 loaded" in r.stdout, r.stdout + r.stderr
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert sorted(r["text"] for r in wh.rows("SELECT text FROM questions")) == ["What is 2+3?", "What is 4+4?"]


def test_math_generators_with_overrides():
    gens = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"],
                                 "allow_parentheses": False, "allow_negation": False}, "gcd": {"max_value": 20}}
    items = default_math(20, 0, "seed", gens) + default_math(20, 0, "validation", gens)
    assert {i.source for i in items} == {"reasoning_gym:basic_arithmetic", "reasoning_gym:gcd"}
    for i in items:
        if i.source.endswith("basic_arithmetic"):
            a, b = re.findall(r"\d+", i.question)[:2]
            # reasoning-gym draws 1-digit terms up to 10
            assert int(i.verifier["answer"]) == int(a) + int(b) and max(int(a), int(b)) <= 10
        else:
            assert int(i.verifier["answer"]) <= 20
    assert [i.question for i in default_math(20, 0, "seed", gens)] == [i.question for i in items[:20]]


def test_math_generators_name_what_is_wrong():
    with pytest.raises(ConfigError, match="no generator 'basic_arithmetics'"):
        default_math(4, 0, "seed", {"basic_arithmetics": {}})
    with pytest.raises(ConfigError, match=r"seeds.math_generators.gcd: reasoning-gym refused"):
        default_math(4, 0, "seed", {"gcd": {"max_digits": 3}})


def test_validation_math_never_repeats_a_seed_or_itself():
    from types import SimpleNamespace

    from sage.stages.seed import held_out_math
    from sage.warehouse import norm_hash

    tiny = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"],
                                 "allow_parentheses": False, "allow_negation": False}}  # 121 distinct sums
    cfg = SimpleNamespace(seeds=SimpleNamespace(seed=0, math_generators=tiny), validate=SimpleNamespace(n_math=40))
    seeds = default_math(60, 0, "seed", tiny)
    seen = {norm_hash(i.question) for i in seeds}
    assert len(seen) < 60  # the space is small enough that draws repeat
    val = held_out_math(SimpleNamespace(cfg=cfg), set(seen))
    hashes = [norm_hash(i.question) for i in val]
    assert len(val) == 40 and len(set(hashes)) == 40 and not set(hashes) & seen
    # a small space beside a large one keeps its share: as many of each generator as of the other
    both = {**tiny, "gcd": {"max_value": 1000}}
    cfg.seeds.math_generators, cfg.validate.n_math = both, 61
    val = held_out_math(SimpleNamespace(cfg=cfg), set(seen))
    assert Counter(i.source for i in val) == {"reasoning_gym:basic_arithmetic": 31, "reasoning_gym:gcd": 30}
    assert not {norm_hash(i.question) for i in val} & seen
    # a space too small for its share is named, with what to change
    cfg.validate.n_math = 400
    with pytest.raises(ConfigError, match=r"validate.n_math=400: .*basic_arithmetic \d+ of 200.*lower validate.n_math"):
        held_out_math(SimpleNamespace(cfg=cfg), set(seen))
    # with nothing to avoid, the default set is the plain first draw, as before
    cfg.validate.n_math = 40
    cfg.seeds.math_generators = None
    assert [i.question for i in held_out_math(SimpleNamespace(cfg=cfg), set())] == \
        [i.question for i in default_math(40, 0, "validation")]


def test_code_splits_stay_disjoint_however_many_are_asked_for():
    """Each split draws from its own half of the tasks, however many are asked for (the seed split ran on into
    the validation half)."""
    seed, validation = default_code(10_000, 0, "seed"), default_code(10_000, 0, "validation")
    assert len(seed) <= len(validation) <= len(seed) + 1 and len(seed) > 1000


def test_a_space_too_small_is_named_after_a_few_draws(monkeypatch):
    """`validate.n_math=100000` over small spaces drew 64 x 100,000 problems (minutes, gigabytes) before saying so:
    a generator is drawn until a thousand draws in a row bring nothing new."""
    import sage.engines.data.seeds as seeds
    from sage.warehouse import norm_hash

    drawn = []
    problem = seeds._problem
    monkeypatch.setattr(seeds, "_problem", lambda *a: drawn.append(a[3]) or problem(*a))
    tiny = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"],
                                 "allow_parentheses": False, "allow_negation": False}}  # 121 distinct sums
    want = {"reasoning_gym:basic_arithmetic": 100_000}
    assert seeds.math_space_short(want, 0, "validation", tiny, set(), norm_hash) == \
        "reasoning_gym:basic_arithmetic 121 of 100000"
    assert len(drawn) <= 3000
    seen = {norm_hash(i.question) for i in default_math(2000, 0, "validation", tiny)}  # every one of them
    assert seeds.math_space_short(want, 0, "validation", tiny, seen, norm_hash) == \
        "reasoning_gym:basic_arithmetic 0 of 100000"
    assert seeds.math_space_short({"reasoning_gym:basic_arithmetic": 100}, 0, "validation", tiny, set(),
                                  norm_hash) == ""


def test_seeds_follow_the_settings_not_the_order_a_config_was_written_in():
    """`sage seed` reads the YAML (generators in its order); `sage run` reads the stored run config (keys sorted):
    the same flags draw the same problems either way."""
    from sage.configs import config_from_dict, config_json, load_config
    from sage.stages.context import StageContext
    from sage.stages.seed import held_out_math

    cfg = load_config("cpu", ["seeds.n_math=12", "validate.n_math=2"])
    stored = config_from_dict(json.loads(config_json(cfg)))
    assert list(cfg.seeds.math_generators) != list(stored.seeds.math_generators)  # the order differs
    for a, b in ((cfg, stored), (stored, cfg)):
        s = a.seeds
        assert default_math(12, s.seed, "seed", s.math_generators) == \
            default_math(12, b.seeds.seed, "seed", b.seeds.math_generators)
    seen: set[str] = set()
    assert held_out_math(StageContext(cfg, None), seen) == held_out_math(StageContext(stored, None), seen)


def test_a_reference_solution_that_times_out_under_load_is_retried_with_a_longer_limit(monkeypatch):
    from sage.configs import load_config
    from sage.engines.data.seeds import SeedItem
    from sage.stages import seed
    from sage.stages.context import StageContext

    # the machine was busy: the first, parallel pass timed out (wall clock) on every reference solution
    monkeypatch.setattr(seed, "reference_chunk", lambda engines, jobs: [
        (None, "the reference solution failed (timeout)") for _ in jobs])
    items = [SeedItem("code", "double", {"entry_point": "f", "inputs": [[1], [2]]}, "test",
                      solution="def f(x):\n    return 2 * x\n"),
             SeedItem("code", "loops", {"entry_point": "g", "inputs": [[1]]}, "test",
                      solution="def g(x):\n    while True:\n        pass\n")]
    ctx = StageContext(load_config("cpu", ["sandbox.timeout_s=1", "sandbox.cpu_s=1"]), None)
    try:
        kept, dropped = seed._complete_code(ctx, items)
    finally:
        ctx.close()
    assert [i.question for i in kept] == ["double"] and kept[0].verifier["outputs"] == [2, 4]
    assert [i.question for i, _ in dropped] == ["loops"]  # out of CPU time with the longer limit too
    assert dropped[0][1].startswith("the reference solution failed (timeout")


def test_heldout_test_files_load_as_test_problems_never_in_the_pool(tmp_path):
    """`seeds.heldout`: each line a test problem, stored with origin `test` (domain math unless given, no problem
    twice), counted in the report; the seeds' key changes only with the setting; a bad line names file and line."""
    from sage.configs import load_config
    from sage.stages import seed
    from sage.stages.context import StageContext
    from sage.warehouse.queries import pool_texts

    src = _write_jsonl(tmp_path / "s.jsonl", [GOOD_MATH])
    held = _write_jsonl(tmp_path / "ood.jsonl", [{"question": "What is 1.5 + 2.1?", "answer": "3.6", "source": "ood:d"},
                                                 {"question": "What is 1.5 + 2.1? "}, dict(GOOD_CODE, question="f")])
    cfg = load_config("cpu", [f"seeds.source={src}", f"seeds.heldout=[{held}]"])
    with Warehouse.open(":memory:") as wh:
        ctx = StageContext(cfg, wh)
        report = seed.run(ctx)
        rows = wh.rows("SELECT origin, domain, text, source, verifier FROM questions ORDER BY origin, text")
        assert [(r["origin"], r["domain"], r["text"]) for r in rows] == [
            ("seed", "math", "What is 2+3?"), ("test", "math", "What is 1.5 + 2.1?"), ("test", "code", "f")]
        assert rows[1]["source"] == "ood:d" and json.loads(rows[1]["verifier"]) == {"answer": "3.6"}
        assert report.info["test"] == 2 and [r["text"] for r in pool_texts(wh, "r")] == ["What is 2+3?"]
        assert seed.seeds_key(ctx) != seed.seeds_key(StageContext(load_config("cpu", [f"seeds.source={src}"]), None))
    (tmp_path / "bad.jsonl").write_text('{"question": "q"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(SeedFileError, match=r"bad.jsonl:2: expected a JSON object with a non-empty 'question'"):
        seed.test_rows([str(tmp_path / "bad.jsonl")])
    with pytest.raises(SeedFileError, match=r"missing.jsonl: cannot read the held-out file"):
        seed.test_rows([str(tmp_path / "missing.jsonl")])
