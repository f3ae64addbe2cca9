"""orchestration.runner = ray: the same iteration and the same evaluation through prefect-ray's RayTaskRunner
and through the local runner give the same rows; Ray workers report to the flow's Prefect API; the context
that started Ray stops it. One local Ray instance (2 CPUs) serves the whole module."""

from __future__ import annotations

import json
import time

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'sage-evolve[ray]')")
pytest.importorskip("prefect_ray", reason="the ray extra is not installed (pip install 'sage-evolve[ray]')")

from sage.configs import load_config  # noqa: E402
from sage.flows.session import Session  # noqa: E402
from sage.stages import evaluate  # noqa: E402
from sage.warehouse.checkpoints import resolve_checkpoint  # noqa: E402
from tests.flows import scripted_run  # noqa: E402
from tests.flows.test_iteration import dump  # noqa: E402
from tests.scripted import ScriptedLLM, prompt_text  # noqa: E402
from tests.stages.test_evaluate import GSM8K  # noqa: E402

# tasks of 3 rows, larger than the scripted run's commits (run.batch_rows 2), smaller than a benchmark
RAY = ["orchestration.runner=ray", "orchestration.ray_num_cpus=2", "orchestration.chunk_size=3"]


@pytest.fixture(scope="module")
def ray_owner(prefect_api, tmp_path_factory):
    """A session that started the module's Ray instance (as `sage run` would); closed by the last test."""
    s = Session(tmp_path_factory.mktemp("ray-owner"))
    s.context_for(load_config("cpu", RAY), None)  # a context of a Ray run starts the local Ray instance
    assert ray.is_initialized()
    yield s
    s.close()


def _iteration(directory, extra, ray_session=None):
    from sage.flows.iteration import iteration_flow

    rid = scripted_run.prepare(directory, "scripted", extra)
    with Session(directory, engines={"llm": scripted_run.PausingScriptedLLM(None, None)}, ray=ray_session):
        iteration_flow(str(directory), rid, 1)  # a Ray instance handed in outlives the session
    return dump(directory)


def _fanout_task_runs(prefix: str, want: int, wait_s: float = 30.0) -> list:
    """Task runs named like `prefix`; the server records them from events, a moment after they ran."""
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    deadline = time.monotonic() + wait_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=prefix)))
            done = [r for r in runs if r.state_name == "Completed"]
            if len(done) >= want or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)


def _task_run_name(task_run_id) -> str:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_task_run(task_run_id).name


def test_iteration_through_ray_matches_local(ray_owner, tmp_path):
    local = _iteration(tmp_path / "local", [])
    remote = _iteration(tmp_path / "ray", RAY, ray_owner.ray)

    verdicts = remote["verdicts"]
    solver = [r for r in remote["rollouts"] if r["purpose"] in ("probe", "solve")]
    assert len(solver) == 20 and len(verdicts) == len(solver)  # none lost
    assert len({v["rollout_id"] for v in verdicts}) == len(verdicts)  # none twice
    assert [(v["rollout_id"], v["s_gt"], v["kind"]) for v in verdicts] == \
           [(v["rollout_id"], v["s_gt"], v["kind"]) for v in local["verdicts"]]
    assert {v["kind"] for v in verdicts} == {"math", "code"} and {v["s_gt"] for v in verdicts} == {0.0, 1.0}
    assert remote == local  # and so every downstream row: admission, plans, rewards

    # the verify stages sent 10 probe + 10 solve rows in tasks of 3 rows (committed 2 by 2): 8 tasks,
    # recorded by the workers in the flow's (test) Prefect API, nested under the stage tasks that sent them
    runs = _fanout_task_runs("verify rows", 8)
    assert len(runs) == 8 and all(r.state_name == "Completed" for r in runs)
    assert {_task_run_name(r.task_inputs["__parents__"][0].id) for r in runs} == {"verify_probe", "verify"}


def _eval(tmp_path, overrides, spec, limit=None, ray_session=None):
    golds = {r["question"]: r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in GSM8K}
    he = {p.question: p.verifier["reference"] for p in evaluate.load_benchmark("humaneval", limit=3)}

    def script(req):
        q = prompt_text(req)
        for i, (question, gold) in enumerate(golds.items()):
            if question in q:
                return [f"<answer>\\boxed{{{gold if (i + s) % 2 else 999}}}</answer>" for s in range(req.n)]
        prompt, body = next((p, b) for p, b in he.items() if p.strip() in q)
        return [f"<answer>\n```python\n{body if s % 3 else 'return None'}\n```\n</answer>" for s in range(req.n)]

    cfg = load_config("cpu", [f"run.dir={tmp_path}", "roles.solver.constrain=false", *overrides])
    with Session(tmp_path, engines={"llm": ScriptedLLM(script)}, ray=ray_session) as s:
        ctx = s.context_for(cfg, None)
        problems = evaluate.load_problems(ctx, spec, limit)
        evaluate.run(ctx, resolve_checkpoint(ctx.wh, None, "base"), spec, problems, n=4, ks=[1, 2, 4])
        return ctx.wh.rows("SELECT eval_id, metric, value, n, decoding FROM evaluations ORDER BY eval_id")


@pytest.mark.parametrize("bench", ["gsm8k", "humaneval"])
def test_evaluation_through_ray_matches_local(ray_owner, tmp_path, bench):
    if bench == "gsm8k":
        path = tmp_path / "gsm8k.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in GSM8K), encoding="utf-8")
        spec, limit = f"gsm8k={path}", None
    else:
        spec, limit = "humaneval", 3
    local = _eval(tmp_path / "local", [], spec, limit)
    remote = _eval(tmp_path / "ray", RAY, spec, limit, ray_owner.ray)

    assert len(local) == 4 and remote == local  # pass@1 greedy, pass@1/2/4 sampled: same ids, values, counts
    correct = [json.loads(r["decoding"])["correct"] for r in remote]
    assert all(len(c) == 3 for c in correct) and any(0 < v < 4 for c in correct for v in c.values())


def test_automatic_task_size(ray_owner):
    from sage.flows.fanout import Ray

    fanout = Ray(ray_owner.ray, load_config("cpu", [*RAY, "orchestration.chunk_size=0"]))
    # two tasks per Ray CPU (2 here), never under 16 rows
    assert [fanout.rows_per_task(n) for n in (10, 64, 400)] == [16, 16, 100]
    batches = list(fanout.map(lambda engines, rows: rows, list(range(40)), batch=10))
    assert [len(b) for b in batches] == [10, 6, 10, 6, 8]  # tasks of 16, 16, 8 rows; commits of 10 at most
    assert [x for b in batches for x in b] == list(range(40))


def test_missing_ray_is_a_clear_error(monkeypatch, tmp_path):
    import sage.flows.fanout

    monkeypatch.setattr(sage.flows.fanout, "find_spec", lambda name: None)
    with Session(tmp_path) as s:
        with pytest.raises(ImportError, match=r"pip install 'sage-evolve\[ray\]'"):
            s.context_for(load_config("cpu", RAY), None)
        s.context_for(load_config("cpu"), None)  # the local runner never looks for Ray


def test_local_runner_never_imports_ray(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from sage.configs import load_config; from sage.flows.session import Session; "
            f"ctx = Session({str(tmp_path)!r}).context_for(load_config('cpu'), None); "
            "assert list(ctx.fanout.map(lambda engines, rows: rows, [1, 2, 3], 2)) == [[1, 2], [3]]; "
            "print(sorted(m for m in ('ray', 'prefect_ray', 'prefect') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_closing_the_session_stops_the_ray_it_started(ray_owner):
    assert ray.is_initialized()
    ray_owner.close()
    assert not ray.is_initialized() and ray_owner.ray is None
