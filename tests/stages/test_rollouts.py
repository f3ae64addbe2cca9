"""Generation shared by the role stages (`stages/rollouts.py`): grammar annealing, on the real warehouse with the
ScriptedLLM (which records every request, so the test sees which samples were asked for under the grammar)."""

from __future__ import annotations

import pytest

from sage.configs import config_hash, config_json, load_config
from sage.configs.names import Purpose, Stage
from sage.engines.text import tags
from sage.stages.context import Engines, StageContext
from sage.stages.prompts import PromptKind
from sage.stages.rollouts import Unit, generate
from sage.warehouse import Warehouse
from tests.flows.scripted_run import OVERRIDES
from tests.scripted import ScriptedLLM


def script(req):
    """A sample under the grammar is well formed, one without it is not (as the bundled model's mostly are)."""
    return ["<answer>\\boxed{4}</answer>" if req.regex_for(j) else "four" for j in range(req.n)]


@pytest.fixture
def make_ctx(tmp_path):
    opened = []

    def make(*extra: str, iteration: int = 1, llm_type: type = ScriptedLLM) -> tuple[StageContext, ScriptedLLM]:
        cfg = load_config("cpu", [f"run.dir={tmp_path}", *OVERRIDES, "roles.solver.constrain=true", *extra])
        wh = Warehouse.open(tmp_path / f"wh{len(opened)}.duckdb")
        wh.insert_batch("runs", [dict(run_id="r", config=config_json(cfg), config_hash=config_hash(cfg),
                                      base_model=cfg.model.name, seed=0)])
        llm = llm_type(script)
        engines = Engines(cfg, llm=llm)
        opened.extend([wh, engines])
        return StageContext(cfg=cfg, wh=wh, run_id="r", iteration=iteration, engines=engines), llm

    yield make
    for x in opened:
        x.close()


def units(n_questions: int = 12, n: int = 8) -> list[Unit]:
    return [Unit("solver_math", f"q{k}", "math", {"question": f"What is {k}+{k}?"}, n=n) for k in range(n_questions)]


def stored(ctx: StageContext, purpose: Purpose) -> list[dict]:
    return ctx.wh.rows("SELECT question_id, sample_index, constrained, format_reward FROM rollouts "
                       "WHERE purpose = ? ORDER BY question_id, sample_index", [purpose])


def test_without_annealing_every_training_sample_is_constrained(make_ctx):
    ctx, llm = make_ctx("roles.solver.unconstrained=[]")  # cpu.yaml anneals the Solver's grammar
    generate(ctx, Stage.SOLVE, Purpose.SOLVE, units(3, 2))
    regex = tags.role_regex(tags.role_key("solver", "math"), ctx.cfg.roles.solver.max_new_tokens)
    assert all(r.regex == regex and not r.free for r in llm.requests)
    assert [row["constrained"] for row in stored(ctx, Purpose.SOLVE)] == [True] * 6


def test_annealing_draws_the_iterations_share_without_the_grammar_and_stores_which(make_ctx):
    schedule = "roles.solver.unconstrained=[0.0, 0.5, 1.0]"
    for iteration, low, high in [(1, 0, 0), (2, 30, 66), (3, 96, 96), (7, 96, 96)]:  # the last value holds
        ctx, llm = make_ctx(schedule, iteration=iteration)
        generate(ctx, Stage.SOLVE, Purpose.SOLVE, units())
        rows = stored(ctx, Purpose.SOLVE)
        free = [r for r in rows if not r["constrained"]]
        assert low <= len(free) <= high, (iteration, len(free))
        # what the engine was asked is what the warehouse says, and the format reward is the sample's own
        asked = {(r.messages[-1]["content"], j) for r in llm.requests for j in r.free}
        assert len(asked) == len(free)
        assert all(r["format_reward"] == 0.0 for r in free)
        assert all(r["format_reward"] == 1.0 for r in rows if r["constrained"])


def test_the_same_samples_are_drawn_unconstrained_on_a_rerun(make_ctx):
    first, _ = make_ctx("roles.solver.unconstrained=[0.5]")
    generate(first, Stage.SOLVE, Purpose.SOLVE, units())
    again, _ = make_ctx("roles.solver.unconstrained=[0.5]")
    generate(again, Stage.SOLVE, Purpose.SOLVE, units())
    assert stored(first, Purpose.SOLVE) == stored(again, Purpose.SOLVE)


@pytest.mark.parametrize("purpose, greedy", [(Purpose.PROBE, False), (Purpose.VALIDATE, True)])
def test_probes_and_validation_stay_constrained(make_ctx, purpose, greedy):
    ctx, llm = make_ctx("roles.solver.unconstrained=[1.0]")
    generate(ctx, Stage.SOLVE, purpose, units(3, 2), greedy=greedy)
    assert llm.requests and all(r.regex and not r.free for r in llm.requests)
    assert all(row["constrained"] for row in stored(ctx, purpose))


class _InBatches(ScriptedLLM):
    """A ScriptedLLM that tells `progress` after every `every` requests, as the hf engine does after each
    token-budget batch of one call."""

    every = 3

    def generate(self, requests, progress=None):
        results = super().generate(requests)
        for done in range(self.every, len(requests) + self.every, self.every):
            if progress is not None:
                progress(min(done, len(requests)), len(requests), 10 * min(done, len(requests)))
        return results


def test_the_bar_moves_with_each_engine_batch_and_commits_stay_as_they_were(make_ctx):
    """Generation reports each batch the engine finishes inside a commit (here 8 units per commit, the engine's
    batches 3 units), with the tokens so far; what is committed, and its ids, are the same as without progress."""
    rows = {}
    for progress in (False, True):
        ctx, llm = make_ctx("run.batch_rows=8", llm_type=_InBatches if progress else ScriptedLLM)
        seen = []
        ctx.progress = lambda stage, done, total, tokens, seen=seen, **kw: seen.append((done, total, tokens))
        generate(ctx, Stage.SOLVE, Purpose.SOLVE, units(12, 2))
        rows[progress] = ctx.wh.rows("SELECT rollout_id, completion_text FROM rollouts ORDER BY rollout_id")
        if progress:
            assert [d for d, _, _ in seen] == [0, 3, 6, 8, 8, 11, 12, 12], seen
            assert all(t == 12 for _, t, _ in seen)
            tokens = [k for _, _, k in seen]
            assert tokens == sorted(tokens) and tokens[1] == 30 and tokens[5] > tokens[4]
        else:
            assert [d for d, _, _ in seen] == [0, 8, 12]
    assert rows[True] == rows[False] and len(rows[True]) == 24


def test_a_role_without_a_parser_raises_instead_of_parsing_as_the_solver():
    from sage.stages.rollouts import parse

    assert parse("solver", "math", "<answer>4</answer>") == tags.parse_solver("<answer>4</answer>", "math")
    with pytest.raises(ValueError, match="no parser for role 'referee'"):
        parse("referee", "math", "<answer>4</answer>")


def test_each_role_generates_with_its_own_adapter_and_the_rows_say_which(make_ctx, tmp_path):
    """`train.adapters` per_role: the Solver generates with the checkpoint's adapter, the Planner with its own in
    `roles/planner`, the Critic (never trained: no adapter of its own) with the base model; `rollouts.adapter`
    records each. Shared: every role with the checkpoint's."""
    checkpoint = tmp_path / "adapters" / "r" / "iteration-1"
    for folder in (checkpoint, checkpoint / "roles" / "planner"):
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
    mixed = [Unit(PromptKind.PLANNER, "q0", "math", {"question": "What is 1+1?"}), units(1, 1)[0],
             Unit(PromptKind.CRITIC_QUESTION, "q1", "math", {"question": "What is 2+2?"})]
    for adapters, expect in (("per_role", [str(checkpoint / "roles" / "planner"), str(checkpoint), None]),
                             ("shared", [str(checkpoint)] * 3)):
        ctx, llm = make_ctx(f"train.adapters={adapters}", iteration=2)
        ctx.adapter = str(checkpoint)
        generate(ctx, Stage.SOLVE, Purpose.SOLVE, mixed)
        assert llm.adapters_used == expect  # one engine call a role, each under its adapter
        rows = ctx.wh.rows("SELECT role, adapter FROM rollouts ORDER BY created_at, role")
        relative = {str(checkpoint): "adapters/r/iteration-1",
                    str(checkpoint / "roles" / "planner"): "adapters/r/iteration-1/roles/planner", None: None}
        assert {r["role"]: r["adapter"] for r in rows} == {
            role: relative[path] for role, path in zip(("planner", "solver", "critic"), expect)}
