"""`write_report` and `report_artifacts` on a warehouse built by hand: three iterations with known numbers,
every PNG written and readable, the HTML showing each plot and the views' numbers; empty plots skipped."""

from __future__ import annotations

import base64
import re

import pytest
from matplotlib.image import imread

from sage.flows.artifacts import artifact_key
from sage.flows.report import PLOTS, report_artifacts, write_report
from sage.stages.score import REWARD_VERSION, score_id
from sage.warehouse import Warehouse

RUN = "run-A1"
# iteration -> generated questions: (admitted, rejection reason, s_q, difficulty)
GENERATED = {
    1: [(True, None, 0.8, 0.5), (False, "low_quality", 0.2, 0.9)],                   # mean s_q .5, diff .7
    2: [(True, None, 0.9, 0.25), (True, None, 0.7, 0.5), (False, "invalid_verifier", 0.6, None),
        (False, "duplicate", 0.3, 0.75)],                                              # mean s_q .625, diff .5
    3: [(False, "duplicate", 0.4, 0.1), (False, "low_quality", 0.1, 0.2)],            # mean s_q .25, diff .15
}
REWARDS = {  # (iteration, role) -> rewards of its rollouts
    (1, "solver"): [0.25, 0.75], (2, "solver"): [1.0, 0.5], (3, "solver"): [0.75, 0.875],   # .5 .75 .8125
    (1, "challenger"): [0.3], (2, "challenger"): [0.4375], (3, "challenger"): [0.6],
}
PLANS = {1: [True, True, False], 2: [True, False, False, False], 3: [True, True]}    # 2/3, 1/4, 2/2
LOSSES = {1: [0.75, 0.5], 2: [0.25, -0.125, 0.0625], 3: [0.5]}  # optimizer steps per iteration
HOSTILE = "</pre><script>alert(1)</script>\x1b[2J"
VALIDATION = {1: (0.3125, 0.25, 0.375, False), 2: (0.5625, 0.5, 0.625, True), 3: (0.4375, 0.375, 0.5, False)}


def build(wh: Warehouse, run_id: str = RUN, iterations=(1, 2, 3), full: bool = True) -> None:
    wh.insert_batch("runs", [{"run_id": run_id, "config": {"profile": "test", "note": "<b>bold</b>"},
                              "config_hash": "h", "base_model": "tiny", "seed": 7}])
    wh.insert_batch("iterations", [{"run_id": run_id, "iteration": k, "status": "done"} for k in iterations])
    wh.insert_batch("questions", [{"question_id": f"seed{i}", "origin": "seed", "domain": "math", "text": f"seed {i}",
                                   "verifier": {"answer": str(i)}, "norm_hash": f"s{i}"} for i in range(4)])
    if not full:
        return
    questions, rollouts, scores, plans, checkpoints, verdicts = [], [], [], [], [], []
    for k, rows in GENERATED.items():
        for j, (admitted, reason, s_q, diff) in enumerate(rows):
            questions.append({"question_id": f"{run_id}-q{k}{j}", "origin": "generated",
                              "domain": "code" if j else "math", "text": f"question {k}.{j}",
                              "verifier": {"answer": "1"}, "norm_hash": f"{run_id}{k}{j}",
                              "run_id": run_id, "iteration": k, "s_q": s_q, "difficulty": diff,
                              "admitted": admitted, "admitted_iteration": k if admitted else None,
                              "rejection_reason": reason})
    for q in [q for q in questions if q["difficulty"] is not None]:  # two probe answers each: p = 1 - difficulty
        for j in range(2):
            rid = f"{q['question_id']}-probe{j}"
            rollouts.append({"rollout_id": rid, "run_id": run_id, "iteration": q["iteration"], "stage": "probe",
                             "role": "solver", "purpose": "probe", "question_id": q["question_id"], "template": "v1",
                             "prompt_text": "p", "completion_text": "c", "prompt_ids": [1, 2], "completion_ids": [3],
                             "sample_index": j, "seed": j, "format_reward": 1.0})
            verdicts.append({"rollout_id": rid, "run_id": run_id, "iteration": q["iteration"], "kind": q["domain"],
                             "s_gt": 1 - q["difficulty"]})
    for (k, role), rewards in REWARDS.items():
        for j, reward in enumerate(rewards):
            rid = f"{run_id}-r{k}{role}{j}"
            rollouts.append({"rollout_id": rid, "run_id": run_id, "iteration": k, "stage": "score", "role": role,
                             "purpose": "solve", "question_id": "seed0", "template": "v1", "prompt_text": "p",
                             "completion_text": "c", "prompt_ids": [1, 2], "completion_ids": [3], "sample_index": j,
                             "seed": j, "format_reward": 1.0})
            scores.append({"score_id": score_id(rid), "reward_version": REWARD_VERSION, "rollout_id": rid,
                           "run_id": run_id, "iteration": k, "role": role, "reward": reward,
                           "components": {"s_gt": reward}, "group_key": f"{k}{role}", "advantage": 0.0})
    for k, passed in PLANS.items():
        plans += [{"plan_id": f"{run_id}-p{k}{j}", "run_id": run_id, "iteration": k, "question_id": "seed0",
                   "s_p": 0.9 if ok else 0.1, "passed": ok} for j, ok in enumerate(passed)]
    for k, (acc, vm, vc, best) in VALIDATION.items():
        checkpoints.append({"run_id": run_id, "iteration": k, "adapter_path": f"/adapters/{k}", "val_accuracy": acc,
                            "val_math": vm, "val_code": vc, "is_best": best})
    rollouts[-1]["completion_text"] = HOSTILE
    steps = [{"run_id": run_id, "iteration": k, "step": j, "loss": loss, "grad_norm": 0.5 * loss + 1, "tokens": 100,
              "seconds": 0.25} for k in (1, 2, 3) for j, loss in enumerate(LOSSES[k], start=1)]
    evaluations = [{"eval_id": f"{run_id}-e1", "run_id": run_id, "checkpoint": "best", "benchmark": "math500",
                    "metric": "pass@1", "value": 0.3333, "n": 12, "decoding": {"temperature": 0.0}}]
    timings = [{"run_id": run_id, "iteration": k, "stage": "train", "status": "done", "seconds": 12.5 * k}
               for k in (1, 2, 3)]
    for table, rows in [("questions", questions), ("rollouts", rollouts), ("verdicts", verdicts), ("scores", scores),
                        ("plans", plans),
                        ("checkpoints", checkpoints), ("train_steps", steps), ("evaluations", evaluations),
                        ("stage_runs", timings)]:
        assert wh.insert_batch(table, rows) == len(rows)


@pytest.fixture
def wh(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        build(wh)
        yield wh


def cells(page: str, table: str) -> list[list[str]]:
    """Rows of cell texts of the HTML table under the <h2> named `table`."""
    section = page.split(f"<h2>{table}</h2>", 1)[1].split("</table>", 1)[0]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", section) if "<td" in row]


def test_write_report_plots_and_tables(wh, tmp_path):
    index = write_report(wh, RUN, tmp_path / "report")
    assert index == tmp_path / "report" / "index.html"
    page = index.read_text(encoding="utf-8")
    for stem, *_ in PLOTS:
        png = tmp_path / "report" / f"{stem}.png"
        image = imread(png)
        assert image.shape[0] >= 300 and image.shape[1] >= 500 and image.std() > 0.01  # not a blank canvas
        assert f'src="{stem}.png"' in page
    assert "skipped" not in page

    drift = cells(page, "curriculum_drift")  # iteration, pool_size, generated, admitted, rejected, by reason, ...
    assert [r[:8] for r in drift] == [["1", "5", "2", "1", "1", "1", "0", "0"],
                                      ["2", "7", "4", "2", "2", "0", "1", "1"],
                                      ["3", "7", "2", "0", "2", "1", "0", "1"]]
    assert [r[8:10] for r in drift] == [["0.5", "0.7"], ["0.625", "0.5"], ["0.25", "0.15"]]  # mean s_q, difficulty
    rewards = {(r[0], r[1]): r[3] for r in cells(page, "role_rewards")}  # iteration, role, rollouts, mean_reward
    assert rewards == {("1", "challenger"): "0.3", ("1", "solver"): "0.5", ("2", "challenger"): "0.4375",
                       ("2", "solver"): "0.75", ("3", "challenger"): "0.6", ("3", "solver"): "0.8125"}
    gate = cells(page, "gate_stats")  # iteration, plans, passed, withheld, pass_rate, mean_s_p
    assert [r[:5] for r in gate] == [["1", "3", "2", "1", "0.6667"], ["2", "4", "1", "3", "0.25"],
                                     ["3", "2", "2", "0", "1"]]
    val = cells(page, "validation_curve")  # iteration, val_accuracy, val_math, val_code, is_best, adapter
    assert [r[:5] for r in val] == [["1", "0.3125", "0.25", "0.375", "no"], ["2", "0.5625", "0.5", "0.625", "yes"],
                                    ["3", "0.4375", "0.375", "0.5", "no"]]
    assert "tiny" in page and RUN in page
    curve = tmp_path / "report" / "training_curve.png"
    assert imread(curve).std() > 0.01 and 'src="training_curve.png"' in page
    evals = cells(page, "evaluations")  # checkpoint, benchmark, metric, value, n, decoding, created_at
    assert [r[:5] for r in evals] == [["best", "math500", "pass@1", "0.3333", "12"]]
    assert page.index("<h2>evaluations</h2>") > page.index("<h2>validation_curve</h2>")
    timings = cells(page, "stage_timings")  # iteration, stage, status, rows_in, rows_out, attempts, seconds
    assert [(r[0], r[1], r[6]) for r in timings] == [("1", "train", "12.5"), ("2", "train", "25"),
                                                     ("3", "train", "37.5")]
    assert "sample generations (iteration 3)" in page and "<h3>solver</h3>" in page and "<h3>challenger</h3>" in page
    # model output and config values are text on the page, never markup
    assert "<script>" not in page and "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[2J" in page
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page


def test_training_curve_marks_each_iteration(wh):
    from sage.warehouse.report_queries import training_curve

    rows = training_curve(wh, RUN)
    assert [(r["iteration"], r["step"], r["global_step"]) for r in rows] == \
        [(1, 1, 1), (1, 2, 2), (2, 1, 3), (2, 2, 4), (2, 3, 5), (3, 1, 6)]
    assert [r["tokens_total"] for r in rows] == [100, 200, 300, 400, 500, 600]
    fig = PLOTS[[p[0] for p in PLOTS].index("training_curve")][2]({"training_curve": rows})
    top, bottom = fig.axes
    assert list(top.lines[0].get_ydata()) == [0.75, 0.5, 0.25, -0.125, 0.0625, 0.5]
    assert list(bottom.lines[0].get_ydata()) == [0.5 * v + 1 for v in top.lines[0].get_ydata()]
    assert sorted({line.get_xdata()[0] for line in top.lines[1:]}) == [0.5, 2.5, 5.5]  # iteration boundaries


def test_empty_plots_are_skipped_with_a_note(tmp_path):
    with Warehouse.open(tmp_path / "w.duckdb") as wh:
        build(wh, "bare", iterations=(1,), full=False)
        out = tmp_path / "bare"
        out.mkdir()
        (out / "validation.png").write_bytes(b"stale")
        page = write_report(wh, "bare", out).read_text(encoding="utf-8")
    assert imread(out / "pool_size.png").shape[0] >= 300  # one iteration, 4 seeds: still a pool
    for stem in ("admission", "quality", "probe_pass_rates", "role_rewards", "gate", "validation", "training_curve"):
        assert not (out / f"{stem}.png").exists() and f'src="{stem}.png"' not in page
    assert page.count("skipped:") == 7 and "no optimizer steps recorded" in page
    assert cells(page, "curriculum_drift")[0][:2] == ["1", "4"]


def test_unknown_run(wh, tmp_path):
    with pytest.raises(ValueError, match="no run 'nope'"):
        write_report(wh, "nope", tmp_path)


def test_report_artifacts(wh):
    arts = dict(report_artifacts(wh, RUN))
    names = ("curriculum_drift", "admitted_questions", "role_rewards", "gate_stats", "validation_curve", "evaluations",
             "stage_timings", "samples", "config", "plots")
    keys = [artifact_key("sage", RUN, n) for n in names]
    assert list(arts) == keys and keys[0] == "sage-run-a1-curriculum-drift"
    art = dict(zip(names, (arts[k] for k in keys)))
    # every cell's markdown punctuation is escaped (a number's `.` too: `0\.3333` renders as 0.3333)
    assert "| best | math500 | pass@1 | 0\\.3333 | 12 |" in art["evaluations"]
    assert "| 37\\.5 |" in art["stage_timings"]
    assert "## solver" in art["samples"] and "\x1b" not in art["samples"]
    assert '"note": "<b>bold</b>"' in art["config"] and art["config"].count("```") == 2  # inside one fence
    assert all(re.fullmatch(r"[a-z0-9-]+", k) for k in keys)
    assert "| 2 | 7 | 4 | 2 | 2 | 0 | 1 | 1 | 0\\.625 | 0\\.5 |" in art["curriculum_drift"]
    assert "0\\.8125" in art["role_rewards"] and "0\\.6667" in art["gate_stats"]
    assert "0\\.5625" in art["validation_curve"]
    # the admitted generated questions, oldest first: iteration, family, text, label, ..., s_q, difficulty
    admitted = [line for line in art["admitted_questions"].splitlines() if line.startswith("| ") and "question" in line]
    assert admitted == ["| 1 |  | question 1\\.0 | 1 |  |  |  |  | 0\\.8 | 0\\.5 | no |",
                        "| 2 |  | question 2\\.0 | 1 |  |  |  |  | 0\\.9 | 0\\.25 | no |",
                        "| 2 |  | question 2\\.1 | 1 |  |  |  |  | 0\\.7 | 0\\.5 | no |"]
    uris = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", art["plots"])
    assert len(uris) == len(PLOTS) and all(base64.b64decode(u).startswith(b"\x89PNG") for u in uris)
    assert [k for k, _ in report_artifacts(wh, RUN, images=False)] == keys[:-1]


def test_markdown_table_cells_cannot_become_markdown():
    from sage.flows.report import markdown_table

    hostile = "**bold** [link](http://x) `code` <b>|</b>\n# heading _it_ 1. ~~s~~ !"
    md = markdown_table([{"run_id": "hidden", "text": hostile, "value": 0.25}])
    head, rule, row = md.split("\n")
    assert head == "| text | value |" and rule == "|---|---|"  # run_id is never shown
    assert row == ("| \\*\\*bold\\*\\* \\[link\\]\\(http://x\\) \\`code\\` \\<b\\>\\|\\</b\\> "
                   "\\# heading \\_it\\_ 1\\. \\~\\~s\\~\\~ \\! | 0\\.25 |")
    assert markdown_table([]) == "_no rows_"


def test_numbers_are_right_aligned_and_text_left():
    from sage.flows.report import html_table

    table = html_table([{"run_id": RUN, "iteration": 1, "stage": "train", "seconds": 12.5, "ok": True}])
    assert '<td class="n">1</td><td>train</td><td class="n">12.5</td><td>yes</td>' in table


def test_one_iteration_gets_whole_ticks_and_the_admission_legend_stays_off_the_bars(tmp_path):
    """A run of one iteration: its x axis has whole ticks, the one tick 1 where only iteration 1 has numbers (not
    0.96, 0.98, ...); the admission plot's legend sits beside the axes, never over a bar."""
    from sage.flows.report import _load

    with Warehouse.open(tmp_path / "one.duckdb") as one:
        build(one, iterations=(1,))
        _, tables = _load(one, RUN)
    for stem, _, plot, _ in PLOTS:
        fig = plot(tables)
        if fig is None or stem in ("training_curve", "probe_pass_rates"):  # steps and pass rates, not iterations
            continue
        ax = fig.axes[0]
        low, high = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if low <= t <= high]
        assert ticks and all(t == int(t) for t in ticks), (stem, ticks)
        if stem in ("pool_size", "admission", "quality"):  # the iterations table holds iteration 1 only
            assert ticks == [1.0], (stem, ticks)
        if stem == "admission":
            fig.canvas.draw()
            legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
            assert legend.x0 >= axes.x1, (legend, axes)


def test_probe_pass_rates_stack_admitted_over_rejected_and_shade_the_band(wh):
    """The histogram counts every probed generated question once, admitted and rejected stacked (p = 1 -
    difficulty here), and shades `iteration.admission` band's range when the run admits by it."""
    from sage.flows.report import _load, plot_probe_pass_rates

    _, tables = _load(wh, RUN)
    rows = tables["admission_frontier"]
    assert sorted(r["pass_rate"] for r in rows) == sorted(1 - d for k in GENERATED for *_, d in GENERATED[k]
                                                          if d is not None)
    ax = plot_probe_pass_rates(tables).axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert sum(heights) == len(rows) and not ax.collections  # quality admission: no band
    banded = [{**r, "admission": "band", "band_low": 0.3, "band_high": 0.7} for r in rows]
    spans = plot_probe_pass_rates({"admission_frontier": banded}).axes[0].patches
    assert len(spans) == len(ax.patches) + 1 and spans[-1].get_x() == 0.3  # the band, shaded behind the bars
