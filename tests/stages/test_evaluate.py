"""evaluate: `sage eval` on the tiny model, scoring on known answers, checkpoint resolution, idempotency."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from sage.configs import load_config
from sage.engines.data.benchmarks import load_benchmark, pass_at_k
from sage.flows.eval_command import eval_command, side_by_side
from sage.stages import evaluate
from sage.stages.context import Engines, StageContext
from sage.warehouse import Warehouse
from sage.warehouse.checkpoints import resolve_checkpoint
from tests.scripted import ScriptedLLM, prompt_text

GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 6 eggs. How many eggs are in 5 boxes?", "answer": "6 * 5 = 30\n#### 30"},
    {"question": "Ann had 1,200 dollars and spent 200. How much is left?", "answer": "1200 - 200 = 1000\n#### 1,000"},
]


@pytest.fixture()
def gsm8k_file(tmp_path):
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K), encoding="utf-8")
    return path


def _cli():
    app = typer.Typer()
    app.command("eval")(eval_command)
    app.command("noop")(lambda: None)  # two commands, so `eval` stays a subcommand as in `sage`
    return app


def test_sage_eval_base_on_tiny_model(tiny_model, tmp_path, gsm8k_file, prefect_api):
    args = ["eval", "--config", "cpu", "--set", f"model.name={tiny_model}", "--set", f"run.dir={tmp_path}",
            "--set", "roles.solver.max_new_tokens=12", "--set", "roles.solver.constrain=false",
            "-b", f"gsm8k={gsm8k_file}", "-b", "humaneval", "--limit", "3", "--n", "3", "--k", "1", "--k", "2"]
    r = CliRunner().invoke(_cli(), args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "base" in r.output and "gsm8k" in r.output and "humaneval" in r.output

    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        rows = wh.rows("SELECT * FROM evaluations ORDER BY benchmark, metric")
    # per benchmark: pass@1 greedy, pass@1 and pass@2 over 3 samples
    assert sorted((r["benchmark"], r["metric"]) for r in rows) == sorted(
        [(b, m) for b in ("gsm8k", "humaneval") for m in ("pass@1", "pass@1", "pass@2")])
    for row in rows:
        d = json.loads(row["decoding"])
        assert row["run_id"] is None and row["checkpoint"] == "base" and row["n"] == 3
        assert 0.0 <= row["value"] <= 1.0
        assert len(d["correct"]) == 3 and d["model"] == str(tiny_model)
        if d["samples"] == 1:
            assert d["temperature"] == 0.0 and set(d["correct"].values()) <= {0, 1}
            assert row["value"] == pytest.approx(sum(d["correct"].values()) / 3)
        else:
            assert d["samples"] == 3 and d["temperature"] == load_config("cpu").roles.solver.temperature
            k = int(row["metric"].split("@")[1])
            assert d["k"] == k
            assert row["value"] == pytest.approx(sum(pass_at_k(3, c, k) for c in d["correct"].values()) / 3)

    # asking again finds every row stored: nothing is added, the same numbers are shown
    r = CliRunner().invoke(_cli(), args)
    assert r.exit_code == 0, r.output
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        assert wh.count("evaluations") == 6


def test_sage_eval_rejects_bad_arguments(tmp_path):
    base = ["eval", "--set", f"run.dir={tmp_path}"]
    r = CliRunner().invoke(_cli(), [*base, "-b", "nosuchbench"])
    assert r.exit_code == 2 and "unknown benchmark" in r.output
    r = CliRunner().invoke(_cli(), [*base, "--checkpoint", "best"])
    assert r.exit_code == 2 and "--run" in r.output
    r = CliRunner().invoke(_cli(), [*base, "--n", "2", "--k", "5"])
    assert r.exit_code == 2 and "--n >= 5" in r.output


def _ctx(tmp_path, llm) -> StageContext:
    cfg = load_config("cpu", [f"run.dir={tmp_path}", "roles.solver.constrain=false"])
    return StageContext(cfg=cfg, wh=Warehouse.open(tmp_path / "warehouse.duckdb"), engines=Engines(cfg, llm=llm))


def test_right_answers_score_one_and_wrong_zero(tmp_path, gsm8k_file):
    """Scripted generator: gold answers for even problems, wrong ones for odd; HumanEval canonical solutions
    (whole functions, and body-only completions that rely on the prompt) pass every test."""
    golds = {r["question"]: r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in GSM8K}
    he = {p.question: p.verifier["reference"] for p in load_benchmark("humaneval", limit=3)}

    def script(req):
        q = prompt_text(req)
        for question, gold in golds.items():
            if question in q:
                good = list(golds).index(question) % 2 == 0
                return [f"So <answer>\\boxed{{{gold if good else 999}}}</answer>", "no idea"] * (req.n // 2 + 1)
        for prompt, body in he.items():
            if prompt.strip() in q:
                return f"<answer>\n```python\n{body}\n```\n</answer>"  # body only: the prompt holds the def
        raise AssertionError("unexpected prompt")

    llm = ScriptedLLM(script)
    ctx = _ctx(tmp_path, llm)
    try:
        spec = f"gsm8k={gsm8k_file}"
        problems = evaluate.load_problems(ctx, spec)
        target = resolve_checkpoint(ctx.wh, None, "base")
        report = evaluate.run(ctx, target, spec, problems, n=4, ks=[1, 4])
        assert llm.calls == [6]  # one generate call: 3 greedy requests + 3 sampled
        rows = {(r["metric"], json.loads(r["decoding"])["samples"]): r
                for r in ctx.wh.rows("SELECT * FROM evaluations")}
        assert rows[("pass@1", 1)]["value"] == pytest.approx(2 / 3)      # problems 0 and 2 right
        assert rows[("pass@1", 4)]["value"] == pytest.approx(2 / 3 * 0.5)  # half the samples of those right
        assert rows[("pass@4", 4)]["value"] == pytest.approx(2 / 3)
        assert report.rows_out == 3 and len(report.info["eval_ids"]) == 3

        again = evaluate.run(ctx, target, spec, problems, n=4, ks=[1, 4])
        assert again.rows_out == 0 and llm.calls == [6]  # stored: nothing generated

        code = evaluate.load_problems(ctx, "humaneval", limit=3)
        evaluate.run(ctx, target, "humaneval", code)
        value = ctx.wh.scalar("SELECT value FROM evaluations WHERE benchmark = 'humaneval'")
        assert value == 1.0
    finally:
        ctx.close()
        ctx.wh.close()


def test_side_by_side_puts_checkpoints_in_columns():
    rows = [dict(label=c, benchmark=b, metric=m, setting=s, n=5, value=v)
            for c, v in (("base", 0.1), ("best (iteration 2)", 0.3))
            for b in ("humaneval", "math500") for m, s in (("pass@2", "n=4 T=1"), ("pass@1", "greedy"))]
    table = side_by_side(rows)
    assert [(t["benchmark"], t["metric"]) for t in table] == [
        ("humaneval", "pass@1 (greedy)"), ("humaneval", "pass@2 (n=4 T=1)"),
        ("math500", "pass@1 (greedy)"), ("math500", "pass@2 (n=4 T=1)")]
    assert table[0]["base"] == 0.1 and table[0]["best (iteration 2)"] == 0.3 and table[0]["problems"] == 5


def test_sage_eval_base_and_best_when_best_is_the_base_model(prefect_api, monkeypatch, tmp_path, gsm8k_file):
    """A run whose validation never beat the base model: `--checkpoint base --checkpoint best` evaluates the base
    model once (no adapter) and shows it under both names."""
    from sage.flows import session
    from sage.warehouse.validate_queries import BASE, mark_best, record_validation
    from tests.flows import scripted_run

    golds = {r["question"]: r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in GSM8K}

    def script(req):
        q = prompt_text(req)
        i, gold = next((i, g) for i, (question, g) in enumerate(golds.items()) if question in q)
        return f"<answer>\\boxed{{{gold if i % 2 == 0 else 999}}}</answer>"

    llm = ScriptedLLM(script)
    rid = scripted_run.prepare(tmp_path, "flat")
    with session.Session(tmp_path) as s:
        record_validation(s.warehouse, rid, 0, BASE, {"val_accuracy": 0.5, "val_math": 0.5, "val_code": None})
        record_validation(s.warehouse, rid, 1, BASE, {"val_accuracy": 0.25, "val_math": 0.25, "val_code": None})
        assert mark_best(s.warehouse, rid) == 0

    class ScriptedSession(session.Session):
        def __init__(self, directory, **kw):
            super().__init__(directory, **{**kw, "engines": {"llm": llm}})

    monkeypatch.setattr(session, "Session", ScriptedSession)
    r = CliRunner().invoke(_cli(), ["eval", "--run", rid, "--dir", str(tmp_path), "--checkpoint", "base",
                                    "--checkpoint", "best", "-b", f"gsm8k={gsm8k_file}"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    out = " ".join(r.output.split())
    assert "base" in out and "best (iteration 0)" in out and out.count("0.667") == 2
    assert llm.adapters_used == [None] and llm.calls == [3]  # generated once, with no adapter
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        rows = wh.rows("SELECT run_id, checkpoint, benchmark, metric, value FROM evaluations")
    assert rows == [{"run_id": rid, "checkpoint": "base", "benchmark": "gsm8k", "metric": "pass@1",
                     "value": pytest.approx(2 / 3)}]
