"""experiments/ablation.py: the order of its runs, every row a valid config, and two rows (the full loop, the
Solver alone) of one iteration on the tiny model: drawn alike, ablated as configured, scored out of distribution, in
one table, resumed by a rerun that redoes nothing, and a row's entry kept once its run folder is deleted."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.ablation import ABLATIONS, BASELINE, ROWS, plan
from sage.configs import load_config
from sage.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[2]


def test_every_row_for_the_first_seed_then_the_seeded_rows_for_the_others():
    runs = plan([0, 1, 2], ABLATIONS, ["full", "solver-alone"])
    assert set(ABLATIONS) <= set(ROWS)
    assert runs[:len(ABLATIONS)] == [(0, r) for r in ABLATIONS]
    assert runs[len(ABLATIONS):] == [(1, "full"), (1, "solver-alone"), (2, "full"), (2, "solver-alone")]


@pytest.mark.parametrize("row", list(ROWS))
def test_every_row_is_a_valid_config_that_differs_from_the_full_loop(row):
    """A row's overrides load on the baseline (the Solver's reward weights still sum to one, say), and all but the
    full loop's change what they name. The baseline is the loop the stored rows ran, plans always shown, whatever
    loop `cpu.yaml` runs."""
    full, changed = load_config("cpu", BASELINE), load_config("cpu", [*BASELINE, *ROWS[row][1]])
    assert (changed == full) == (row == "full")
    assert (full.iteration.hints, full.train.hinted_prompt, full.train.loss_weighting) == ("always", "shown",
                                                                                          "role_mean")
    assert (full.rewards.solver_plan, full.rewards.solver_gt) == (0.2, 0.6)


def _ablation(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.ablation", "--model", "tiny", "--iterations", "1",
                           "--rows", "full", "solver-alone", "--kl-sequences", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def _read(folder: Path) -> dict:
    with Warehouse.open(folder / "warehouse.duckdb", read_only=True) as wh:
        return {"run": wh.scalar("SELECT run_id FROM runs"),
                "generated": wh.scalar("SELECT count(*) FROM questions WHERE origin = 'generated'"),
                "plans": wh.scalar("SELECT count(*) FROM plans"),
                "trained_roles": {r["role"] for r in wh.rows(
                    "SELECT DISTINCT role FROM rollouts WHERE purpose <> 'validate'")},
                "rollouts": wh.scalar("SELECT count(*) FROM rollouts"),
                "base": {r["question_id"]: r["s_gt"] for r in wh.rows(
                    """SELECT r.question_id, v.s_gt FROM rollouts r JOIN verdicts v USING (rollout_id)
                       WHERE r.purpose = 'validate' AND r.iteration = 0""")}}


def test_full_loop_and_solver_alone_drawn_alike_in_one_table(tmp_path):
    res = _ablation(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    full, alone = _read(tmp_path / "seed-0" / "full"), _read(tmp_path / "seed-0" / "solver-alone")
    assert full["run"] == alone["run"] == "ablation-s0"
    assert full["generated"] > 0 and full["plans"] > 0
    assert alone["generated"] == 0 and alone["plans"] == 0 and alone["trained_roles"] == {"solver"}
    assert full["base"] and full["base"] == alone["base"]  # the same validation problems, the same base verdicts

    table = json.loads((tmp_path / "ablation.json").read_text())
    assert set(table) == {"0/full", "0/solver-alone"}
    assert "vs_full" in table["0/solver-alone"] and "vs_full" not in table["0/full"]
    for entry in table.values():
        assert entry["n"] == len(full["base"]) and len(entry["curve"]) == 2 and entry["cpu_s"] > 0 < entry["stage_s"]
        assert entry["ood_n"] == 300  # the kept checkpoint and the base model answered the out-of-distribution set
    assert "ood_vs_full" in table["0/solver-alone"]
    report = (tmp_path / "ablation.md").read_text()
    assert "| 0 | solver-alone |" in report and (tmp_path / "ablation.png").exists()

    again = _ablation(tmp_path)  # resumes: every stage is done, nothing is generated again
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _read(tmp_path / "seed-0" / "full")["rollouts"] == full["rollouts"]
    assert _read(tmp_path / "seed-0" / "solver-alone")["rollouts"] == alone["rollouts"]

    # the full loop's run folder deleted (its adapters are the bulk of a study's disk): the table keeps its entry
    # from ablation.json, and the Solver alone is still compared with it through the verdicts kept there
    shutil.rmtree(tmp_path / "seed-0" / "full")
    report = subprocess.run([sys.executable, "-m", "experiments.ablation", "--report", "--rows", "full",
                             "solver-alone", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    kept = json.loads((tmp_path / "ablation.json").read_text())
    assert kept["0/full"]["carried"] and not kept["0/solver-alone"].get("carried")
    for key in ("vs_full", "ood_vs_full"):
        assert kept["0/solver-alone"][key] == table["0/solver-alone"][key]
    assert "Carried over from the previous `ablation.json` (their run folders are gone): 0/full." in \
        (tmp_path / "ablation.md").read_text()


def _entry(seed: int, row: str, **paired) -> dict:
    return {"seed": seed, "row": row, "iterations": 5, "pass1": 0.5, "ood": 0.1, **paired}


def test_across_seeds_counts_the_seeds_where_the_full_loop_wins_and_names_any_ablation_that_beats_it():
    from experiments.ablation import across_seeds

    table = {"0/full": _entry(0, "full"),
             # b = the full loop right and this row wrong: seeds 0 and 2 lose to the full loop with p < 0.05
             "0/solver-alone": _entry(0, "solver-alone", vs_full=(10, 12, 0.83), ood_vs_full=(20, 5, 0.004)),
             "1/solver-alone": _entry(1, "solver-alone", vs_full=(5, 20, 0.004), ood_vs_full=(9, 8, 1.0)),
             "2/solver-alone": _entry(2, "solver-alone", vs_full=(3, 4, 1.0), ood_vs_full=(15, 3, 0.0075)),
             "0/no-planner": _entry(0, "no-planner", vs_full=(2, 3, 1.0), ood_vs_full=(1, 12, 0.0034)),
             "1/full": {**_entry(1, "full"), "iterations": 0, "pass1": 0.4}}  # at its base model: left out
    text = "\n".join(across_seeds(table))
    assert "in 2 of 3 run seed(s) scored (0, 2)" in text
    assert "1/solver-alone (validation)" in text and "0/no-planner (out of distribution)" in text
    assert "0/solver-alone (" not in text  # it lost, or drew, everywhere
    assert "| solver-alone | 3 | 0.500 (0.500 - 0.500) | 0.100 (0.100 - 0.100) |" in text
    assert "| full | 1 | 0.500 (0.500 - 0.500) |" in text


def test_run_level_compares_a_row_with_the_solver_alone_at_a_fixed_iteration_across_seeds():
    """The run seed is the unit: per seed the difference of pass@1 at iteration 2, its mean, the 95% t interval
    and the paired t-test. Differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t = 0.2 / (0.1 / sqrt 3) = 3.464 with 2 df,
    p = 0.0742; half-width t(0.975, 2) = 4.303 x 0.1 / sqrt 3 = 0.248. OOD where both rows scored iteration 2."""
    from experiments.ablation import run_level, run_level_lines

    def entry(seed, row, at2, ood=None):
        e = {"seed": seed, "row": row, "iterations": 2, "curve": [0.4, 0.45, at2]}
        return {**e, "ood_curve": {"0": 0.05, "2": ood}} if ood is not None else e

    table = {f"{s}/{r}": entry(s, r, v, o) for s, r, v, o in [
        (0, "solver-alone", 0.5, 0.10), (1, "solver-alone", 0.4, 0.10), (2, "solver-alone", 0.45, None),
        (0, "full", 0.6, 0.15), (1, "full", 0.6, 0.05), (2, "full", 0.75, 0.2), (3, "full", 0.9, 0.9)]}
    r = run_level(table, "full", at=2)
    assert r["validation"]["seeds"] == [0, 1, 2] and r["validation"]["diffs"] == pytest.approx([0.1, 0.2, 0.3])
    assert r["validation"]["mean"] == pytest.approx(0.2) and r["validation"]["p"] == pytest.approx(0.0742, abs=1e-4)
    assert r["validation"]["ci"] == pytest.approx((0.2 - 0.2484, 0.2 + 0.2484), abs=1e-4)
    assert r["ood"]["seeds"] == [0, 1] and r["ood"]["diffs"] == pytest.approx([0.05, -0.05])
    assert r["ood"]["mean"] == pytest.approx(0.0)
    assert run_level(table, "full", at=3)["validation"]["seeds"] == []  # no row reached iteration 3
    text = "\n".join(run_level_lines(table, 2))
    assert "| full | validation | 0, 1, 2 | +0.100, +0.200, +0.300 | +0.200 [-0.048, +0.448] | 0.074 |" in text
