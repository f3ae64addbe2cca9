"""experiments/learning.py: its statistics on known values, and a two-iteration run on the tiny model that a
second invocation resumes without recomputing anything; experiments/heldout.py on that run's checkpoint."""

import csv
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from experiments.learning import mcnemar_exact, wilson
from experiments.learning_report import kept_iteration
from sage.warehouse import Warehouse
from sage.warehouse.queries import located_path

ROOT = Path(__file__).resolve().parents[2]


def test_wilson_interval_known_values():
    lo, hi = wilson(50, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.4038, 0.5962)
    lo, hi = wilson(0, 8)  # the upper bound at k = 0 is z^2 / (n + z^2)
    assert lo == 0.0 and hi == pytest.approx(1.959963984540054 ** 2 / (8 + 1.959963984540054 ** 2))
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 1.0)


def test_exact_mcnemar_known_values():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(9, 1) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(3, 3) == 1.0


def test_the_kept_checkpoint_is_the_best_validation_and_the_earliest_of_a_tie():
    rows = [{"iteration": 0, "val_pass1": 0.40}, {"iteration": 1, "val_pass1": 0.47},
            {"iteration": 2, "val_pass1": 0.45}, {"iteration": 3, "val_pass1": 0.47}, {"iteration": 4}]
    assert kept_iteration(rows) == 1
    assert kept_iteration([{"iteration": 0, "val_pass1": 0.5}, {"iteration": 1, "val_pass1": 0.3}]) == 0
    assert kept_iteration([{"iteration": 0}]) is None


def test_exact_mcnemar_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for b, c in [(0, 1), (2, 7), (12, 5), (20, 20), (1, 30), (40, 25)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-12)


def _learning(out: Path) -> subprocess.CompletedProcess:
    # grammar annealing from the second iteration on: the Solver's and the Planner's training samples all drawn
    # without the grammar
    return subprocess.run([sys.executable, "-m", "experiments.learning", "--model", "tiny", "--iterations", "2",
                           "--set", "roles.solver.unconstrained=[0.0, 1.0]",
                           "--set", "roles.planner.unconstrained=[0.0, 1.0]", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def _counts(out: Path) -> tuple[int, int]:
    with Warehouse.open(out / "warehouse.duckdb", read_only=True) as wh:
        return wh.count("rollouts"), wh.scalar("SELECT count(*) FROM rollouts WHERE purpose = 'validate'")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    # Its own private Prefect server, as a user gets: the session-wide test server is a child of this process,
    # and the sandbox tests (later in the order) count stray children.
    out = tmp_path_factory.mktemp("experiments") / "learning"
    return out, _learning(out)


def test_two_iterations_on_the_tiny_model_then_a_resume_that_recomputes_nothing(tiny_run):
    out, first = tiny_run
    assert first.returncode == 0, first.stderr[-3000:]
    with (out / "learning.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["iteration"] for r in rows] == ["0", "1", "2"]
    expected = {"val_pass1", "val_ci_lo", "val_ci_hi", "mcnemar_b", "mcnemar_c", "mcnemar_p", "admission_rate",
                "plan_pass_rate", "kl_mean", "lp_top_change", "lp_bottom_change", "sage_seconds", "kl_seconds",
                *(f"{role}_{m}" for role in ("challenger", "planner", "critic", "solver")
                  for m in ("nonzero_adv", "mean_abs_adv", "reward_mean", "reward_std")),
                *(f"format_{role}_rate" for role in ("challenger", "planner", "critic", "solver"))}
    assert expected <= set(rows[0])
    assert rows[0]["kl_mean"] == "0.0" and rows[0]["mcnemar_p"] == "1.0" and rows[0]["lp_top_change"] == ""
    assert all(0 <= float(r["val_ci_lo"]) <= float(r["val_pass1"]) <= float(r["val_ci_hi"]) <= 1 for r in rows)
    assert all(float(r["kl_mean"]) >= 0 and int(r["solver_rollouts"]) > 0 for r in rows[1:])
    assert int(rows[1]["val_n"]) == 8  # the tiny profile's 4 + 4 validation problems, every iteration
    assert [r["solver_annealed"] for r in rows] == ["", "0", "8"]  # iteration 2: 4 planned questions x 2 samples
    assert rows[1]["solver_annealed_format"] == "" and 0 <= float(rows[2]["solver_annealed_format"]) <= 1
    assert rows[1]["planner_annealed"] == "0" and rows[2]["planner_annealed"] == rows[2]["plans"] != "0"
    assert rows[2]["critic_annealed"] == "0"  # no schedule: every sample constrained
    for name in ("learning.md", "pass1.png", "nonzero_advantage.png", "kl.png", "format.png"):
        assert (out / name).stat().st_size > 0
    assert "| val_pass1 |" in (out / "learning.md").read_text()

    cache, counts = (out / "measures.json").read_text(), _counts(out)
    second = _learning(out)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads((out / "measures.json").read_text())
    assert again["iterations"] == json.loads(cache)["iterations"]  # every measure came from the cache
    assert len(again["invocations"]) == 2 and "over 2 invocation(s)" in (out / "learning.md").read_text()
    assert _counts(out) == counts  # no stage generated anything
    assert not re.search(r"\[learning\] iteration \d+ \w+ \(", second.stdout)  # no measure line
    assert json.loads(cache)["run_id"] in first.stdout



def test_an_interrupted_invocation_counts_its_time(tmp_path):
    """Ctrl-C ends a run resumably (status 130) and its wall and CPU time are still logged, so a row's time over
    several invocations is the sum of all of them, not only of the ones that finished."""
    out = tmp_path / "learning"
    proc = subprocess.Popen([sys.executable, "-m", "experiments.learning", "--model", "tiny", "--iterations", "1",
                             "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("[learning] run "):
            time.sleep(3)
            proc.send_signal(signal.SIGINT)
            break
    proc.stdout.read()
    assert proc.wait(timeout=300) == 130
    runs = json.loads((out / "measures.json").read_text())["invocations"]
    assert len(runs) == 1 and runs[0]["interrupted"] is True
    assert runs[0]["wall_s"] >= 3 and runs[0]["cpu_s"] > 0 and "--iterations 1" in runs[0]["command"]


def _heldout(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.heldout", "--out", str(out), "--n", "12",
                           "--iteration", "2"], cwd=ROOT, capture_output=True, text=True, timeout=900)


def _outcome(wh, iteration: int) -> dict[str, bool]:
    return {r["question_id"]: r["s_gt"] >= 1.0 for r in wh.rows(
        "SELECT r.question_id, v.s_gt FROM rollouts r JOIN verdicts v USING (rollout_id) WHERE r.iteration = ? "
        "AND r.purpose = 'validate'", [iteration])}


def test_heldout_answers_fresh_problems_with_base_and_checkpoint_and_leaves_the_run_untouched(tiny_run):
    out, first = tiny_run
    assert first.returncode == 0, first.stderr[-3000:]
    counts = _counts(out)
    with Warehouse.open(out / "warehouse.duckdb", read_only=True) as wh:
        seen = {r["text"] for r in wh.rows("SELECT text FROM questions")}
        # where the run's adapter is (stored relative to the run's folder, which the held-out folder is not)
        adapter = located_path(wh, wh.scalar("SELECT adapter_out FROM iterations WHERE iteration = 2"))
    done = _heldout(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _counts(out) == counts  # the learning run's warehouse is only read
    with Warehouse.open(out / "heldout-12" / "warehouse.duckdb", read_only=True) as wh:
        questions = wh.rows("SELECT text, source FROM questions WHERE origin = 'validation'")
        by_model = {r["iteration"]: r["adapters"] for r in wh.rows(
            "SELECT iteration, list(DISTINCT adapter) AS adapters FROM rollouts WHERE purpose = 'validate' GROUP BY 1")}
        base, checkpoint = _outcome(wh, 0), _outcome(wh, 2)
        answered = wh.count("rollouts")
    assert len(questions) == 12 and not {q["text"] for q in questions} & seen
    assert sorted(Counter(q["source"] for q in questions).values()) == [2] * 6  # the default generators, 2 each
    assert by_model == {0: [None], 2: [adapter]} and len(base) == len(checkpoint) == 12
    paired = json.loads((out / "heldout-12.json").read_text())["iterations"]["2"]["test"]
    assert (paired["mcnemar_b"], paired["mcnemar_c"]) == (sum(base[q] and not checkpoint[q] for q in base),
                                                          sum(checkpoint[q] and not base[q] for q in base))
    text = (out / "heldout-12.md").read_text()
    assert f"| test pass@1 [95% Wilson] | {sum(base.values()) / 12:.3f}" in text
    assert re.search(r"\| iteration \| 0( \(kept\))? \| 2( \(kept\))? \|\n", text)  # the base model, then iteration 2

    again = _heldout(out)  # a rerun answers nothing again and reports the same
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 answered now" in again.stdout
    with Warehouse.open(out / "heldout-12" / "warehouse.duckdb", read_only=True) as wh:
        assert wh.count("rollouts") == answered
    assert json.loads((out / "heldout-12.json").read_text())["iterations"]["2"]["test"] == paired


def test_heldout_answers_the_validation_set_through_the_pipeline_beside_the_plain_answers(tiny_run):
    """`--validation --pipeline --iteration 0`: the base model alone answers the run's own validation problems plainly
    and through the pipeline (its greedy plan, the Critic's score, the answer shown the plan), and the report puts
    pass@1 with every plan shown and with the gate against the plain answers on the same problems."""
    out, first = tiny_run
    assert first.returncode == 0, first.stderr[-3000:]
    with Warehouse.open(out / "warehouse.duckdb", read_only=True) as wh:
        validation = {r["question_id"] for r in wh.rows("SELECT question_id FROM questions "
                                                        "WHERE origin = 'validation'")}
    done = subprocess.run([sys.executable, "-m", "experiments.heldout", "--out", str(out), "--validation", "--pipeline",
                           "--iteration", "0"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    with Warehouse.open(out / "heldout-validation" / "warehouse.duckdb", read_only=True) as wh:
        asked = {r["question_id"] for r in wh.rows("SELECT question_id FROM questions WHERE origin = 'validation'")}
        purposes = dict(wh.execute("SELECT purpose, count(*) FROM rollouts GROUP BY 1"))
        shown = wh.scalar("SELECT val_plan_shown FROM checkpoints WHERE iteration = 0")
    n = len(validation)
    assert asked == validation and purposes == {p: n for p in ("validate", "validate_plan", "validate_critique",
                                                               "validate_hinted")}
    result = json.loads((out / "heldout-validation.json").read_text())
    assert list(result["iterations"]) == ["0"] and result["set"] == "validation"
    pipeline = result["iterations"]["0"]["pipeline"]
    assert pipeline["n"] == n and pipeline["shown"]["passed"] == round(shown * n)
    assert pipeline["shown"]["passed"] == pipeline["plain"] - pipeline["shown"]["lost"] + pipeline["shown"]["gained"]
    assert "| every plan shown: pass@1 [95%]" in (out / "heldout-validation.md").read_text()
