"""The validate stage on known scripted answers (ScriptedLLM), the real warehouse, math checker and sandbox."""

from __future__ import annotations

import pytest

from sage.configs import config_hash, config_json, load_config
from sage.stages import validate
from sage.stages.context import Engines, StageContext
from sage.warehouse import Warehouse, content_id, norm_hash
from sage.warehouse.queries import record_checkpoint, start_iteration
from sage.warehouse.validate_queries import mark_best, record_validation, validation_history, validation_scores
from tests.flows.scripted_run import OVERRIDES
from tests.scripted import ScriptedLLM, prompt_text

# (question, verifier); the scripted Solver below gets math 2 of 3 right and code 1.0 + 0.5 (mul passes 1 of 2 tests)
MATH = [("What is 2+3?", "5"), ("What is 6*7?", "42"), ("What is 10-4?", "6")]
CODE = [("Write add(a, b) returning a + b.", {"entry_point": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]}),
        ("Write mul(a, b) returning a * b.", {"entry_point": "mul", "inputs": [[2, 3], [4, 5]], "outputs": [6, 20]})]
ANSWERS = {"2+3": "5", "6*7": "42", "10-4": "6"}


def validation_rows(math=MATH, code=CODE) -> list[dict]:
    rows = [dict(question_id=content_id("val", q), origin="validation", domain="math", text=q, verifier={"answer": a},
                 norm_hash=norm_hash(q), source="test") for q, a in math]
    rows += [dict(question_id=content_id("val", q), origin="validation", domain="code", text=q, verifier=v,
                  norm_hash=norm_hash(q), source="test") for q, v in code]
    return rows


def math_answer(text: str, right: bool) -> str:
    key = next(k for k in ANSWERS if k in text)
    return f"The answer is <answer>\\boxed{{{ANSWERS[key] if right else '-1'}}}</answer>"


def code_answer(body: str, name: str) -> str:
    return f"<answer>\n```python\ndef {name}(a, b):\n    return {body}\n```\n</answer>"


def solver(req, adapter) -> str:
    """Base model: math right except 10-4; add right; mul right on one of two tests. Any adapter: all right."""
    text = prompt_text(req)
    if "add(" in text:
        return code_answer("a + b", "add")
    if "mul(" in text:
        return code_answer("a * b" if adapter else "6", "mul")
    return math_answer(text, adapter is not None or "10-4" not in text)


class Recorder(ScriptedLLM):
    """ScriptedLLM whose answers depend on the adapter in use."""

    def __init__(self):
        super().__init__(lambda req: solver(req, self.adapter))


@pytest.fixture
def make_ctx(tmp_path):
    whs = []

    def make(*extra: str, questions: bool = True):
        cfg = load_config("cpu", [f"run.dir={tmp_path}", *OVERRIDES, "validate.max_new_tokens=77", *extra])
        wh = Warehouse.open(tmp_path / f"wh{len(whs)}.duckdb")
        whs.append(wh)
        wh.insert_batch("runs", [dict(run_id="v", config=config_json(cfg), config_hash=config_hash(cfg),
                                      base_model=cfg.model.name, seed=0)])
        seed_q = "What is 1+1?"  # a seed question: in the pool, never validated
        wh.insert_batch("questions", [dict(question_id="s1", origin="seed", domain="math", text=seed_q,
                                           verifier={"answer": "2"}, norm_hash=norm_hash(seed_q))]
                        + (validation_rows() if questions else []))
        llm = Recorder()
        engines = Engines(cfg, llm=llm)  # one set of engines (math checker, sandbox) per test, closed at teardown
        whs.append(engines)

        def ctx(iteration: int) -> StageContext:
            return StageContext(cfg=cfg, wh=wh, run_id="v", iteration=iteration, engines=engines)

        return ctx, wh, llm

    yield make
    for x in whs:
        x.close()


def test_baseline_scores_known_answers_greedily(make_ctx):
    ctx, wh, llm = make_ctx()
    c0 = ctx(0)
    report = validate.run(c0)
    assert report.rows_in == 5 and report.rows_out == 5
    assert all(r.temperature == 0.0 and r.n == 1 and r.max_new_tokens == 77 and r.regex is None
               for r in llm.requests)
    assert len(llm.requests) == 5 and llm.adapters_used and set(llm.adapters_used) == {None}
    rows = wh.rows("SELECT r.iteration, r.stage, r.role, r.plan_id, r.adapter, r.template, q.origin "
                   "FROM rollouts r JOIN questions q USING (question_id) WHERE r.purpose = 'validate'")
    assert len(rows) == 5
    assert all(r["iteration"] == 0 and r["role"] == "solver" and r["plan_id"] is None and r["adapter"] is None
               and r["origin"] == "validation" and "_plan@" not in r["template"] for r in rows)
    cp = wh.rows("SELECT * FROM checkpoints")
    assert len(cp) == 1 and cp[0]["iteration"] == 0 and cp[0]["adapter_path"] == "base"
    assert cp[0]["val_math"] == pytest.approx(2 / 3)
    assert cp[0]["val_code"] == pytest.approx(0.5)                    # pass@1: mul passes only 1 of 2 tests
    assert cp[0]["val_accuracy"] == pytest.approx((1 + 1 + 0 + 1 + 0) / 5)
    assert cp[0]["val_mean_s_gt"] == pytest.approx((1 + 1 + 0 + 1 + 0.5) / 5)
    assert not cp[0]["is_best"]  # the flow marks the best, not the stage

    # idempotent: nothing generated, verified or changed the second time
    before = (wh.count("rollouts"), wh.count("verdicts"), len(llm.calls), cp)
    validate.run(c0)
    assert (wh.count("rollouts"), wh.count("verdicts"), len(llm.calls), wh.rows("SELECT * FROM checkpoints")) \
        == before


def test_trained_adapter_and_training_off(make_ctx):
    ctx, wh, llm = make_ctx()
    c1, c2 = ctx(1), ctx(2)
    # training off: iteration 1 still validates (the base model), recorded as a 'base' checkpoint
    validate.run(c1)
    # an iteration whose train stage wrote an adapter: validate that adapter, keep the row's path and metrics
    start_iteration(wh, "v", 2, None)
    record_checkpoint(wh, "v", 2, "/adapters/v/iteration-2", {"loss": 0.5})
    validate.run(c2)
    cps = {r["iteration"]: r for r in wh.rows("SELECT * FROM checkpoints")}
    assert cps[1]["adapter_path"] == "base" and cps[1]["val_accuracy"] == pytest.approx(0.6)
    assert cps[2]["adapter_path"] == "/adapters/v/iteration-2" and '"loss": 0.5' in cps[2]["metrics"]
    assert (cps[2]["val_accuracy"], cps[2]["val_math"], cps[2]["val_code"]) == (1.0, 1.0, 1.0)
    assert llm.adapters_used[-1] == "/adapters/v/iteration-2"
    assert wh.scalar("SELECT list(DISTINCT adapter) FROM rollouts WHERE iteration = 2") == ["/adapters/v/iteration-2"]
    assert wh.scalar("SELECT count(DISTINCT rollout_id) FROM rollouts WHERE purpose = 'validate'") == 10


def pipeline_model(req) -> str:
    """The base model with plans: the Planner plans; the Critic passes the plans for 2+3 and 10-4 only; shown its
    plan, the Solver gets 10-4 right (the plan helps) and 6*7 wrong (the plan misleads); plain, as `solver`."""
    text = prompt_text(req)
    if "numbered plan" in text:
        return "<plan>\n1. Compute it.\n</plan>"
    if "Rate this plan" in text:
        return "Fine. <score>9</score>" if ("2+3" in text or "10-4" in text) else "Wrong. <score>1</score>"
    if "Plan (follow it)" in text and ("10-4" in text or "6*7" in text):
        return math_answer(text, "10-4" in text)
    return solver(req, None)


def test_the_pipeline_validation_shows_the_models_own_plans_beside_plain_validation(make_ctx):
    """`validate.pipeline`: besides plain validation (0.6, which decides early stopping), the Planner's greedy plans,
    their critiques and the answers shown them give val_plan_shown (every plan shown: 10-4 gained, 6*7 lost, 0.6),
    val_pipeline (shown where the plan passed the gate, 2+3 and 10-4; plain elsewhere: 0.8) and val_plans_passed
    (2 of 5); no rollout of them is trained on, and a re-run generates nothing."""
    ctx, wh, llm = make_ctx("validate.pipeline=true", "iteration.beta=0.5")
    llm.script = pipeline_model
    report = validate.run(ctx(0))
    cp = wh.rows("SELECT * FROM checkpoints")[0]
    assert cp["val_accuracy"] == pytest.approx(0.6)
    assert (cp["val_plan_shown"], cp["val_pipeline"], cp["val_plans_passed"]) == pytest.approx((0.6, 0.8, 0.4))
    assert report.info["val_pipeline"] == pytest.approx(0.8)
    purposes = dict(wh.execute("SELECT purpose, count(*) FROM rollouts GROUP BY purpose"))
    assert purposes == {"validate": 5, "validate_plan": 5, "validate_critique": 5, "validate_hinted": 5}
    assert all(r.temperature == 0.0 for r in llm.requests)
    calls = len(llm.calls)
    validate.run(ctx(0))
    assert len(llm.calls) == calls and wh.count("rollouts") == 20
    plain = make_ctx()[0]
    validate.run(plain(0))
    assert plain(0).wh.rows("SELECT val_pipeline FROM checkpoints")[0]["val_pipeline"] is None


def test_training_on_without_adapter_fails_and_no_questions_skips(make_ctx):
    ctx, wh, _ = make_ctx("train.enabled=true")
    with pytest.raises(RuntimeError, match="no trained adapter yet"):
        validate.run(ctx(3))
    ctx, wh, llm = make_ctx(questions=False)
    report = validate.run(ctx(0))
    assert "skipped" in report.info and not llm.calls and wh.count("checkpoints") == 0


def _answer(wh, iteration: int, qid: str, domain: str, s_gt: float) -> None:
    rid = content_id("answer", iteration, qid)
    wh.insert_batch("rollouts", [dict(rollout_id=rid, run_id="v", iteration=iteration, stage="validate", role="solver",
                                      purpose="validate", question_id=qid, template="t", prompt_text="p",
                                      completion_text="c", prompt_ids=[1], completion_ids=[2], sample_index=0,
                                      seed=0)])
    wh.insert_batch("verdicts", [dict(rollout_id=rid, run_id="v", iteration=iteration, kind=domain, s_gt=s_gt)])


def test_pass_at_1_on_partial_code_answers_decides_the_best(make_ctx):
    _, wh, _ = make_ctx()
    code = [(f"Write f{i}(a, b).", {"entry_point": f"f{i}", "inputs": [[1, 2]], "outputs": [3]}) for i in range(5)]
    wh.insert_batch("questions", validation_rows(math=[("What is 3+3?", "6"), ("What is 3*3?", "9")], code=code))
    code_ids = [content_id("val", q) for q, _ in code]
    math_ids = [content_id("val", q) for q in ("What is 3+3?", "What is 3*3?")]
    # iteration 1: code s_gt 1, 0.6 (3 of 5 tests), 0, 1, 0.8 (4 of 5); math right, wrong
    for qid, s in zip(code_ids, [1.0, 0.6, 0.0, 1.0, 0.8]):
        _answer(wh, 1, qid, "code", s)
    for qid, s in zip(math_ids, [1.0, 0.0]):
        _answer(wh, 1, qid, "math", s)
    # iteration 2: every code answer passes 4 of 5 tests (high mean s_gt, no pass), math both right
    for qid in code_ids:
        _answer(wh, 2, qid, "code", 0.8)
    for qid in math_ids:
        _answer(wh, 2, qid, "math", 1.0)
    s1, s2 = validation_scores(wh, "v", 1), validation_scores(wh, "v", 2)
    assert s1["val_code"] == pytest.approx(2 / 5) and s1["val_math"] == pytest.approx(1 / 2)
    assert s1["val_accuracy"] == pytest.approx(3 / 7)                    # 0.428571
    assert s1["val_mean_s_gt"] == pytest.approx((3.4 + 1.0) / 7)         # 0.628571: partial credit included
    assert (s1["n"], s1["n_math"], s1["n_code"]) == (7, 2, 5)
    assert s2["val_code"] == 0.0 and s2["val_accuracy"] == pytest.approx(2 / 7)   # 0.285714
    assert s2["val_mean_s_gt"] == pytest.approx((4.0 + 2.0) / 7)         # 0.857143: higher, yet not the best
    with wh.transaction():
        record_validation(wh, "v", 1, "/a/1", s1)
        record_validation(wh, "v", 2, "/a/2", s2)
    assert mark_best(wh, "v") == 1                                       # decided on pass@1, not mean s_gt
    curve = validation_history(wh, "v")
    assert [(r["iteration"], r["is_best"], round(r["val_accuracy"], 6), round(r["val_mean_s_gt"], 6)) for r in curve] \
        == [(1, True, 0.428571, 0.628571), (2, False, 0.285714, 0.857143)]
