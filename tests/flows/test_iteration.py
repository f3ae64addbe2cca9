"""One SAGE iteration through the real Prefect flow, the real warehouse, sandbox and math checker, with the
ScriptedLLM choosing every completion so admission, gating and every reward path run on known values."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sage.warehouse import Warehouse
from tests.flows import scripted_run

TABLES = {"questions": "question_id", "rollouts": "rollout_id", "verdicts": "rollout_id", "plans": "plan_id",
          "scores": "rollout_id"}


def dump(directory) -> dict[str, list[dict]]:
    with Warehouse.open(directory / "warehouse.duckdb", read_only=True) as wh:
        out = {}
        for table, key in TABLES.items():
            rows = wh.rows(f"SELECT * EXCLUDE (created_at) FROM {table} ORDER BY {key}")
            for r in rows:
                r.pop("duration_s", None)  # wall time of a verdict
            out[table] = rows
        return out


@pytest.fixture(scope="module")
def one_iteration(prefect_api, tmp_path_factory):
    d = tmp_path_factory.mktemp("scripted")
    scripted_run.run(d)
    return d


def test_admission_gating_and_rewards(one_iteration):
    with Warehouse.open(one_iteration / "warehouse.duckdb", read_only=True) as wh:
        count = lambda purpose: wh.scalar("SELECT count(*) FROM rollouts WHERE purpose = ?", [purpose])  # noqa: E731
        assert count("challenge") == 5 and count("critique_question") == 5
        qs = wh.rows("SELECT domain, text, s_q, difficulty, verifier_valid, admitted, rejection_reason, verifier "
                     "FROM questions WHERE origin = 'generated' ORDER BY question_id")
        assert all(q["s_q"] == pytest.approx(8 / 9) for q in qs)
        assert all(q["verifier_valid"] for q in qs)
        math_q = [q for q in qs if q["domain"] == "math"]
        code_q = [q for q in qs if q["domain"] == "code"]
        # four references produced the same math question: one admitted, three duplicates
        assert sorted(str(q["rejection_reason"]) for q in math_q) == ["None", "duplicate", "duplicate", "duplicate"]
        # cpu.yaml's `math_labels: program`: the program (exactly the question's 3 and 4, and its named `+`) ran in
        # the sandbox and its result is the label, beside the stated answer that agrees with it
        for q in math_q:
            v = json.loads(q["verifier"])
            assert v["label"] == "grounded" and v["answer"] == v["program_result"] == "7"
            assert v["stated_answer"] == "7" and v["answer_agrees"] is True and "return 3 + 4" in v["program"]
        assert all(q["difficulty"] == pytest.approx(0.5) for q in math_q)  # probe answers: one right, one wrong
        assert code_q[0]["admitted"] and code_q[0]["difficulty"] == 0.0
        assert json.loads(code_q[0]["verifier"])["outputs"] == [6, 20, 7]  # computed by the reference in the sandbox
        assert count("probe") == 2 * 5
        assert wh.scalar("SELECT count(*) FROM pool WHERE run_id = 'scripted'") == 5 + 2

        # gate: plans about 10-3 score 2 -> s_p = 1/9 < beta, withheld; others 8 -> 7/9, shown
        plans = wh.rows("SELECT p.s_p, p.passed, q.text FROM plans p JOIN questions q USING (question_id)")
        assert len(plans) == 5
        for p in plans:
            assert p["passed"] == ("10-3" not in p["text"])
            assert p["s_p"] == pytest.approx(1 / 9 if "10-3" in p["text"] else 7 / 9)
        shown = wh.rows("SELECT r.template, pl.passed FROM rollouts r JOIN plans pl ON pl.plan_id = r.plan_id "
                        "WHERE r.purpose = 'solve'")
        assert shown and all(r["template"].split("@")[0].endswith("_plan") == r["passed"] for r in shown)

        # every reward path against its formula
        scores = wh.rows("SELECT s.role, r.purpose, s.reward, s.components, s.advantage, s.group_key, q.admitted "
                         "FROM scores s JOIN rollouts r USING (rollout_id) "
                         "LEFT JOIN questions q ON q.rollout_id = s.rollout_id AND q.origin = 'generated'")
        assert {s["purpose"] for s in scores} == {"challenge", "critique_question", "critique_plan", "plan", "solve"}
        # the difficulty third is paid only to an admitted question (REWARD_VERSION 3): the three duplicates are
        # suppressed although their s_q >= alpha and their verifier is valid
        challenge = [s for s in scores if s["purpose"] == "challenge"]
        assert sorted(bool(s["admitted"]) for s in challenge) == [False, False, False, True, True]
        for s in scores:
            c = json.loads(s["components"])
            if s["purpose"] == "challenge":
                assert c["admitted"] == bool(s["admitted"]) and c["suppressed"] == (not s["admitted"])
                if s["admitted"]:
                    assert s["reward"] == pytest.approx((c["s_q"] + c["r_d"] + c["r_f"]) / 3)
                else:
                    assert s["reward"] == pytest.approx((c["s_q"] + c["r_f"]) / 3)
            elif s["role"] == "critic":
                assert s["reward"] == c["r_f"] == 1.0
            elif s["purpose"] == "plan":
                assert s["reward"] == pytest.approx(0.5 * c["s_p"] + 0.5 * c["r_f"])
            else:
                assert s["reward"] == pytest.approx(0.2 * c["s_p_tilde"] + 0.6 * c["s_gt"] + 0.2 * c["r_f"])
                assert c["s_p_tilde"] in (0.0, pytest.approx(7 / 9))
        for role in ("challenger", "planner", "critic", "solver"):
            adv = [s["advantage"] for s in scores if s["role"] == role]
            assert sum(adv) == pytest.approx(0.0, abs=1e-6)
        assert wh.scalar("SELECT count(*) FROM stage_runs WHERE run_id = 'scripted' AND status = 'done'") == 11


def test_rerun_after_success_changes_no_row(one_iteration):
    before = dump(one_iteration)
    scripted_run.run(one_iteration)
    assert dump(one_iteration) == before


def test_stage_cli_reruns_one_stage(one_iteration):
    before = dump(one_iteration)
    cmd = [sys.executable, "-m", "sage.flows.cli", "stage", "verify", "--run", "scripted", "--iteration", "1",
           "--dir", str(one_iteration)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "already done" in r.stdout, r.stderr[-2000:]
    r = subprocess.run(cmd + ["--force"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert dump(one_iteration) == before
    with Warehouse.open(one_iteration / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT attempts FROM stage_runs WHERE stage = 'verify'") == 2
    r = subprocess.run(cmd[:4] + ["nonsense"] + cmd[5:], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "unknown stage" in r.stderr


def test_sigkill_mid_stage_then_rerun_equals_uninterrupted(prefect_api, one_iteration, tmp_path):
    marker = tmp_path / "paused"
    killed = tmp_path / "killed"
    # calls: challenge 1-3, critique 4-6, probe 7-9; call 8 is the second probe batch: earlier stages and one probe
    # batch are committed
    p = subprocess.Popen([sys.executable, "-m", "tests.flows.scripted_run", str(killed), "--pause-at-call", "8",
                          "--marker", str(marker)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.time() + 240
    while not marker.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert marker.exists(), "the scripted run never reached the pause"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)
    with Warehouse.open(killed / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT count(*) FROM rollouts WHERE purpose = 'probe'") == 4  # 2 probe units, 2 samples
        assert wh.scalar("SELECT status FROM stage_runs WHERE stage = 'probe'") == "running"
    r = subprocess.run([sys.executable, "-m", "tests.flows.scripted_run", str(killed)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert dump(killed) == dump(one_iteration)


def test_garbage_output_never_fails_a_stage(prefect_api, tmp_path):
    from sage.flows import session
    from sage.flows.evolve import evolve_flow
    from tests.scripted import ScriptedLLM

    garbage = ["", "x" * 10_000, "<question><question>\u202e\ud800 \x00</answer>", "<answer>```python\ndef (:\n```",
               "<score>11</score><score>", "\u0000" * 50 + "<plan></plan>", "🙂" * 500]
    rid = scripted_run.prepare(tmp_path, "garbage")
    with session.Session(tmp_path, engines={"llm": ScriptedLLM(lambda req: garbage[req.seed % len(garbage)])}):
        evolve_flow(str(tmp_path), rid, 1)
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT count(*) FROM stage_runs WHERE run_id = 'garbage' AND status = 'done'") == 11
        assert wh.scalar("SELECT count(*) FROM questions WHERE origin = 'generated' AND admitted") == 0
        assert wh.scalar("SELECT count(*) FROM scores WHERE run_id = 'garbage'") > 0


def test_run_publishes_iteration_and_report_artifacts(one_iteration):
    import json

    from prefect.artifacts import Artifact

    tables = {name: Artifact.get(f"scripted-iteration-1-{name}")
              for name in ("questions", "plans", "solver", "roles", "training")}
    assert all(t is not None and t.type == "table" for t in tables.values())
    rows = {name: json.loads(t.data) for name, t in tables.items()}
    assert rows["questions"][0]["generated"] == 5 and isinstance(rows["questions"][0]["mean_s_q"], float)
    assert {r["role"] for r in rows["roles"]} == {"challenger", "planner", "critic", "solver"}
    assert all(isinstance(r["rollouts"], int) and isinstance(r["mean_reward"], float) for r in rows["roles"])
    assert rows["plans"][0]["plans"] >= 1 and rows["solver"] and rows["training"] == []  # train.enabled false
    samples = Artifact.get("scripted-iteration-1-samples")
    assert samples is not None and samples.type == "markdown"
    for role in ("challenger", "planner", "critic", "solver"):
        assert f"## {role}" in samples.data
    drift = Artifact.get("sage-scripted-curriculum-drift")
    assert drift is not None and "| 1 |" in drift.data


def test_a_stage_found_done_ends_skipped_and_a_run_stage_logs_its_numbers(one_iteration):
    from prefect import flow

    from sage.flows.iteration import SKIPPED, stage_task, summary_line
    from sage.flows.session import Session

    @flow
    def again():
        return stage_task(str(one_iteration), "scripted", 1, "admit", return_state=True)

    with Session(one_iteration):
        state = again()
    assert state.name == "Skipped" and state.is_completed() and state.message == SKIPPED
    assert summary_line("admit", {"rows_in": 5, "rows_out": 5, "admitted": 3, "rejected": 2, "duplicate": None}) \
        == "admit: 5 in, 5 out; admitted 3, rejected 2"


#: The stages each ablation switch turns off.
SWITCHED = {"challenge": "challenger", "critique_question": "challenger", "probe": "challenger",
            "verify_probe": "challenger", "admit": "challenger", "plan": "planner", "critique_plan": "planner"}


def test_a_switched_off_stage_generates_and_writes_nothing_and_its_line_says_why(scripted_stage):
    from sage.flows.iteration import RUNNABLE, summary_line

    ctx, llm = scripted_stage(scripted_run.script, "iteration.challenger=false", "iteration.planner=false")
    ctx.wh.insert_batch("questions", scripted_run.seed_rows())  # a pool to sample: on, the stages would generate
    for name, role in SWITCHED.items():
        report = RUNNABLE[name](ctx)
        assert summary_line(name, {"rows_in": report.rows_in, "rows_out": report.rows_out, **report.info}) == (
            f"{name}: 0 in, 0 out; skipped iteration.{role} is false")
    assert llm.calls == [] and ctx.wh.count("rollouts") == ctx.wh.count("plans") == 0
    assert ctx.wh.count("questions") == len(scripted_run.seed_rows())


def test_an_iteration_without_the_challenger_and_the_planner_runs_end_to_end(prefect_api, tmp_path):
    """Both ablation switches off: the iteration writes no question and no plan, the pool stays the seeds, the Solver
    answers the sampled pool questions without a plan and earns no plan term; the summaries, views and report
    take an iteration without generated questions or plans."""
    from sage.flows import session
    from sage.flows.evolve import evolve_flow
    from sage.flows.report import write_report
    from tests.scripted import ScriptedLLM, prompt_text

    rid = scripted_run.prepare(tmp_path, "ablation", ["iteration.challenger=false", "iteration.planner=false"])
    llm = ScriptedLLM(scripted_run.script)
    with session.Session(tmp_path, engines={"llm": llm}):
        summary, = evolve_flow(str(tmp_path), rid, 1)
    tasks = [prompt_text(r) for r in llm.requests]
    assert len(tasks) == 5 and not any("Plan (follow it)" in t for t in tasks)  # the 5 seeds, each answered once
    with Warehouse.open(tmp_path / "warehouse.duckdb", read_only=True) as wh:
        assert wh.scalar("SELECT count(*) FROM questions WHERE origin <> 'seed'") == wh.count("plans") == 0
        assert wh.scalar("SELECT count(*) FROM pool WHERE run_id = 'ablation'") == 5
        assert wh.rows("SELECT purpose, role, count(*) AS n, count(plan_id) AS planned FROM rollouts GROUP BY ALL") == [
            {"purpose": "solve", "role": "solver", "n": 10, "planned": 0}]
        scores = wh.rows("SELECT reward, components FROM scores")
        assert len(scores) == 10
        for s in scores:
            c = json.loads(s["components"])
            assert c["s_p_tilde"] == 0.0 and s["reward"] == pytest.approx(0.6 * c["s_gt"] + 0.2 * c["r_f"])
        assert wh.scalar("SELECT count(*) FROM stage_runs WHERE run_id = 'ablation' AND status = 'done'") == 11
        assert wh.rows("SELECT generated, admitted, pool_size FROM curriculum_drift WHERE run_id = 'ablation'") == [
            {"generated": 0, "admitted": 0, "pool_size": 5}]
        assert wh.scalar("SELECT count(*) FROM curriculum_audit WHERE run_id = 'ablation'") == 0
        page = write_report(wh, rid, tmp_path / "report")
    assert summary["plans"] == [] and [(r["solver"], r["answers"]) for r in summary["solver"]] == [("without plan", 10)]
    assert [r["role"] for r in summary["roles"]] == ["solver"] and page.exists()


def test_sample_generations_markdown_cannot_be_broken_by_model_output():
    from sage.flows.samples import samples_markdown

    hostile = "```\n# heading\n\x1b[2J\x00 <script>alert(1)</script> ````"
    md = samples_markdown(2, [dict(role="solver", purpose="solve", prompt_tail="Solve ```x```", completion_text=hostile,
                                   format_reward=1.0, reward=0.5, advantage=-0.25)])
    assert "\x1b" not in md and "\x00" not in md and "\\x1b" in md
    completion = md.split("Completion:\n")[1]
    fence = completion.split("text\n")[0]
    assert len(fence) == 5 and completion.rstrip().endswith(fence)  # longer than any backtick run inside
    assert "format_reward 1.000, reward 0.500, advantage -0.250" in md


def test_live_artifacts_follow_a_stage_in_the_prefect_ui(prefect_api, monkeypatch):
    """Inside a flow run: a progress artifact per stage, updated in place (for training at every update, with its
    loss), and when training ends the table of its updates. Outside a run: nothing. A failing API: said once, the
    stage goes on."""
    import json

    from prefect import flow
    from prefect.artifacts import Artifact

    from sage.flows.artifacts import LiveArtifacts

    live = LiveArtifacts(every=3600.0)   # rows: only the first report and the last reach the UI
    seen = []

    @flow
    def training():
        for k in (1, 2, 3):
            live.report("Run_A", 2, "train", k, 3, unit="steps",
                        metrics={"step": k, "loss": 1.0 / k, "grad_norm": 0.5, "tokens": 10, "ignored": "x"})
            progress = Artifact.get("run-a-iteration-2-train-progress")
            seen.append((float(progress.data), progress.description, Artifact.get("run-a-iteration-2-train-steps")))
        for k in (1, 5, 9, 10):
            live.report("Run_A", 2, "solve", k, 10)
            seen.append(float(Artifact.get("run-a-iteration-2-solve-progress").data))

    training()
    assert [s[0] for s in seen[:3]] == [33.3, 66.7, 100.0]                     # every update, in place
    assert seen[1][1] == "train, iteration 2 of run Run_A: 2/3 steps, loss 0.5, grad norm 0.5"
    assert seen[0][2] is None and seen[1][2] is None and seen[2][2] is not None  # the table once, at the end
    rows = json.loads(seen[2][2].data)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2] == {"step": 3, "loss": 0.3333, "grad_norm": 0.5, "entropy": None,                # 4 digits
                       "clip_fraction": None, "learning_rate": None, "tokens": 10, "seconds": None}
    assert seen[3:] == [10.0, 10.0, 10.0, 100.0]                                # rows: at most every `every` s
    assert "solve, iteration 2 of run Run_A: 10/10 rows" in Artifact.get("run-a-iteration-2-solve-progress").description

    LiveArtifacts().report("Run_B", 1, "train", 1, 1, metrics={"step": 1})          # no flow run: nothing
    assert Artifact.get("run-b-iteration-1-train-progress") is None

    calls = []

    def down(*args, **kwargs):
        calls.append(args)
        raise ConnectionError("the API is down")

    monkeypatch.setattr("prefect.artifacts.create_progress_artifact", down)
    broken = LiveArtifacts()

    @flow
    def unreachable():
        for k in (1, 2):
            broken.report("Run_C", 1, "solve", k, 2)

    import logging

    said: list[logging.LogRecord] = []
    listener = logging.Handler()
    listener.emit = said.append   # wherever Prefect's logging config sends the record, it is heard here
    logging.getLogger("sage.flows.artifacts").addHandler(listener)
    try:
        unreachable()                                                               # completes
    finally:
        logging.getLogger("sage.flows.artifacts").removeHandler(listener)
    assert len(calls) == 1                                                          # tried once, then left alone
    assert [r.getMessage() for r in said] == [
        "stopped updating the Prefect UI's live progress: ConnectionError: the API is down"]
