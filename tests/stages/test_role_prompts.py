"""What the role stages put in their prompts: the Planner, the Critic (questions and plans) and the Solver see
a code question's function, a generated question's signature or a seed's entry point."""

from __future__ import annotations

import pytest

from sage.configs import load_config
from sage.stages import critique, plan, solve
from sage.stages.context import Engines, StageContext
from sage.warehouse import Warehouse, norm_hash
from tests.scripted import ScriptedLLM

pytestmark = pytest.mark.fast

SEED_CODE = "Write a function that returns the sum of the squares of a list of integers."
GENERATED = "Return the product of the digits of a positive integer."


def _reply(req) -> str:
    task = req.messages[-1]["content"]
    if "Rate this" in task:
        return "Clear. <score>9</score>"
    if "numbered plan" in task:
        return "<plan>\n1. Loop.\n2. Add.\n</plan>"
    return "<answer>\n```python\ndef f(x):\n    return x\n```\n</answer>"


@pytest.fixture
def ctx(tmp_path):
    cfg = load_config("cpu", [f"run.dir={tmp_path}", "iteration.domains=[code]", "iteration.n_plan=1",
                              "iteration.n_solve=1", "iteration.n_probe=1", "iteration.hints=always",
                              "train.hinted_prompt=shown"])
    wh = Warehouse.open(tmp_path / "w.duckdb")
    wh.insert_batch("questions", [
        dict(question_id="seed", origin="seed", domain="code", text=SEED_CODE, norm_hash=norm_hash(SEED_CODE),
             verifier={"entry_point": "sum_squares", "inputs": [[[1, 2]]], "outputs": [5]}),
        dict(question_id="gen", origin="generated", domain="code", text=GENERATED, norm_hash=norm_hash(GENERATED),
             run_id="r", iteration=1, verifier_valid=True, s_q=0.9, rollout_id="x",
             verifier={"entry_point": "digit_product", "signature": "def digit_product(n: int) -> int",
                       "inputs": [[12]], "outputs": [2]})])
    wh.insert_batch("iterations", [dict(run_id="r", iteration=1)])
    seen: list = []
    llm = ScriptedLLM(lambda req: (seen.append(req), _reply(req))[1])
    yield StageContext(cfg=cfg, wh=wh, run_id="r", iteration=1, engines=Engines(cfg, llm=llm)), seen
    wh.close()


def _tasks(seen, needle: str) -> list[str]:
    return [r.messages[-1]["content"] for r in seen if needle in r.messages[-1]["content"]]


def test_planner_critic_and_solver_see_the_function(ctx):
    context, seen = ctx
    critique.run_questions(context)
    [rated] = _tasks(seen, "Rate this problem")
    assert GENERATED in rated and "Function: def digit_product(n: int) -> int" in rated
    probe = solve.run_probe(context)
    assert probe.rows_out == 1 and "Function: def digit_product(n: int) -> int" in _tasks(seen, "Solve this task")[0]
    plan.run(context)                                    # the pool is the seed alone (nothing admitted yet)
    [planned] = _tasks(seen, "numbered plan")
    assert SEED_CODE in planned and "Function: sum_squares" in planned
    critique.run_plans(context)
    [rated_plan] = _tasks(seen, "Rate this plan")
    assert "Function: sum_squares" in rated_plan and "1. Loop." in rated_plan
    solve.run_solve(context)
    assert "Function: sum_squares" in _tasks(seen, "Solve this task")[-1]
