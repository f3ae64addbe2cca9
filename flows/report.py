"""`sage report`: PNG plots and an HTML page of one run, from the warehouse's views only.

Plots (one PNG each, skipped with a note on the page when the run has no data for it): pool size per
iteration, admitted versus rejected by reason, mean s_q and difficulty of generated questions, mean reward
per role, the plan gate's pass rate, the validation curve with the best checkpoint marked, and the training
curve (loss and grad norm per optimizer step across iterations, iteration boundaries marked). The page
also shows the rows of `curriculum_drift`, `role_rewards`, `gate_stats` and `validation_curve` as tables, the
run's `evaluations` (`sage eval`) next to validation, the stage timings (`stage_runs`), a few sample
generations per role from the last iteration (HTML-escaped: model output), and the config the run stored.
`report_artifacts` gives the same content as Markdown for Prefect's `create_markdown_artifact`.

Matplotlib is used through `Figure` objects with the Agg canvas, never pyplot, so no global backend or
window state is touched (the flow may call this from a worker thread).
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sage.flows.artifacts import artifact_key
from sage.flows.samples import fenced, samples_html, samples_markdown
from sage.warehouse import report_queries as q
from sage.warehouse.db import Warehouse
from sage.warehouse.runs import dead_rows

Tables = dict[str, list[dict]]
#: The rejection columns of `curriculum_drift` (`rejected_<reason>`); `ungrounded` sums a math label's reasons
#: (`stages.admit.LABEL_FAILURES`).
REJECTION_REASONS = ("low_quality", "invalid_verifier", "ungrounded", "duplicate", "near_duplicate", "contaminated",
                     "unparseable")


def iteration_figure(title: str) -> tuple[Figure, object]:
    """A 7 x 4 inch figure with one axis over iterations (integer ticks, one tick for a run of one iteration), as
    every curve of the report has."""
    fig = Figure(figsize=(7, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # never 0.96, 0.98, 1.00 ...
    ax.grid(alpha=0.3)
    return fig, ax


def _column(rows: list[dict], name: str) -> list:
    return [r.get(name) for r in rows]


def _has(rows: list[dict], *names: str) -> bool:
    return any(r.get(n) is not None for r in rows for n in names)


# -- plots: each returns a Figure, or None when its data is empty ----------------------------------------------

def plot_pool_size(t: Tables) -> Figure | None:
    rows = t["curriculum_drift"]
    if not _has(rows, "pool_size"):
        return None
    fig, ax = iteration_figure("Pool size (seeds + admitted questions)")
    ax.plot(_column(rows, "iteration"), _column(rows, "pool_size"), marker="o")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("questions")
    return fig


def plot_admission(t: Tables) -> Figure | None:
    rows = t["curriculum_drift"]
    if not any((r.get("generated") or 0) > 0 for r in rows):
        return None
    fig, ax = iteration_figure("Generated questions: admitted vs rejected by reason")
    its = _column(rows, "iteration")
    bottom = [0] * len(rows)
    parts = [("admitted", [r.get("admitted") or 0 for r in rows])]
    parts += [(f"rejected: {why.replace('_', ' ')}", [r.get(f"rejected_{why}") or 0 for r in rows])
              for why in REJECTION_REASONS]
    other = [max(0, (r.get("rejected") or 0) - sum(r.get(f"rejected_{w}") or 0 for w in REJECTION_REASONS))
             for r in rows]
    if any(other):
        parts.append(("rejected: other", other))
    for label, values in parts:
        ax.bar(its, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("questions")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    return fig


def plot_quality(t: Tables) -> Figure | None:
    rows = t["curriculum_drift"]
    if not _has(rows, "mean_s_q", "mean_difficulty"):
        return None
    fig, ax = iteration_figure("Generated questions: mean quality s_q and difficulty")
    its = _column(rows, "iteration")
    for name, label in (("mean_s_q", "mean s_q (Critic, 0-1)"),
                        ("mean_difficulty", "mean difficulty (1 - probe s_gt)")):
        if _has(rows, name):
            ax.plot(its, [float("nan") if v is None else v for v in _column(rows, name)], marker="o", label=label)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    return fig


def plot_probe_pass_rates(t: Tables) -> Figure | None:
    """How hard the generated questions were for the Solver that probed them: a histogram of their probe pass rates,
    admitted and rejected stacked, with the admission band shaded when `iteration.admission` is band."""
    rows = [r for r in t["admission_frontier"] if r.get("pass_rate") is not None]
    if not rows:
        return None
    fig = Figure(figsize=(7, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    bins = [i / 10 for i in range(11)]
    admitted = [r["pass_rate"] for r in rows if r["admitted"]]
    rejected = [r["pass_rate"] for r in rows if not r["admitted"]]
    ax.hist([admitted, rejected], bins=bins, stacked=True, label=["admitted", "rejected"], color=["C2", "C7"])
    if rows[0]["admission"] == "band":
        ax.axvspan(rows[0]["band_low"], rows[0]["band_high"], color="C1", alpha=0.15, label="admission band",
                   zorder=0)
    ax.set_xlabel(f"probe pass rate (mean s_gt of {max(r['probes'] for r in rows)} probe answers at most)")
    ax.set_ylabel("generated questions")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"Probe pass rates of the generated questions (admission: {rows[0]['admission']})")
    ax.legend(fontsize="small")
    return fig


def plot_role_rewards(t: Tables) -> Figure | None:
    rows = t["role_rewards"]
    if not _has(rows, "mean_reward"):
        return None
    fig, ax = iteration_figure("Mean reward per role")
    for role in sorted({r["role"] for r in rows}):
        mine = [r for r in rows if r["role"] == role]
        ax.plot(_column(mine, "iteration"), _column(mine, "mean_reward"), marker="o", label=role)
    ax.set_ylabel("mean reward")
    ax.legend(fontsize="small")
    return fig


def plot_gate(t: Tables) -> Figure | None:
    rows = t["gate_stats"]
    if not _has(rows, "pass_rate"):
        return None
    fig, ax = iteration_figure("Plan gate: share of plans shown to the Solver (s_p >= beta)")
    ax.plot(_column(rows, "iteration"), _column(rows, "pass_rate"), marker="o", label="pass rate")
    for r in rows:
        ax.annotate(f"{r['passed']}/{r['plans']}", (r["iteration"], r["pass_rate"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize="small")
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("pass rate")
    return fig


def plot_validation(t: Tables) -> Figure | None:
    rows = t["validation_curve"]
    if not _has(rows, "val_accuracy"):
        return None
    fig, ax = iteration_figure("Validation accuracy (greedy pass@1)")
    its = _column(rows, "iteration")
    for name, label, style in (("val_accuracy", "all", "-"), ("val_math", "math", "--"), ("val_code", "code", ":")):
        if _has(rows, name):
            ax.plot(its, [float("nan") if v is None else v for v in _column(rows, name)], style, marker="o",
                    label=label)
    best = [r for r in rows if r.get("is_best")]
    if best:
        ax.scatter([r["iteration"] for r in best], [r["val_accuracy"] for r in best], marker="*", s=300,
                   color="gold", edgecolors="black", zorder=5, label="best checkpoint")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize="small")
    return fig


def plot_training(t: Tables) -> Figure | None:
    rows = t["training_curve"]
    if not _has(rows, "loss", "grad_norm"):
        return None
    fig = Figure(figsize=(7, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    steps = _column(rows, "global_step")
    for ax, name, label in ((top, "loss", "loss"), (bottom, "grad_norm", "grad norm")):
        ax.plot(steps, [float("nan") if v is None else v for v in _column(rows, name)], marker=".", label=label)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for r in rows:  # an iteration starts at its step 1
            if r["step"] == 1:
                ax.axvline(r["global_step"] - 0.5, color="gray", linestyle="--", linewidth=0.8)
                if ax is top:
                    ax.annotate(f"it {r['iteration']}", (r["global_step"] - 0.5, 1), xytext=(3, -12),
                                xycoords=("data", "axes fraction"), textcoords="offset points", fontsize="small",
                                color="gray")
    top.set_title("Training: loss and grad norm per optimizer step (iterations dashed)")
    bottom.set_xlabel("optimizer step (all iterations)")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


# (file stem, caption, plot function, what is missing when it is skipped)
PLOTS: tuple[tuple[str, str, Callable[[Tables], Figure | None], str], ...] = (
    ("pool_size", "Pool size per iteration", plot_pool_size, "no iterations recorded"),
    ("admission", "Admitted vs rejected by reason", plot_admission, "no generated questions"),
    ("quality", "Mean s_q and mean difficulty", plot_quality, "no scored generated questions"),
    ("probe_pass_rates", "Probe pass rates of the generated questions", plot_probe_pass_rates,
     "no probed generated questions"),
    ("role_rewards", "Mean reward per role", plot_role_rewards, "no scored rollouts"),
    ("gate", "Plan gate pass rate", plot_gate, "no plans judged"),
    ("validation", "Validation curve (best checkpoint starred)", plot_validation, "no validated checkpoints"),
    ("training_curve", "Training curve (loss, grad norm per step)", plot_training, "no optimizer steps recorded"),
)


# -- formatting ------------------------------------------------------------------------------------------------

def fmt(value) -> str:
    """Table cell text: floats to at most 4 decimals without trailing zeros, empty for NULL."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return ""
        text = f"{value:.4f}".rstrip("0").rstrip(".")
        return "0" if text in ("-0", "") else text
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _visible(rows: list[dict]) -> list[str]:
    return [c for c in (rows[0] if rows else {}) if c != "run_id"]


def _align(value) -> str:
    """Numbers right-aligned (their digits line up), text left (`td` is left-aligned)."""
    return ' class="n"' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def html_table(rows: list[dict]) -> str:
    if not rows:
        return '<p class="note">no rows</p>'
    cols = _visible(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td{_align(r[c])}>{html.escape(fmt(r[c]))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<div class=\"wide\"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~&])")


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "_no rows_"
    cols = _visible(rows)
    # model-written text (admitted questions) must not become markdown: every punctuation mark is escaped
    cell = lambda v: _MARKDOWN_SPECIAL.sub(r"\\\1", fmt(v)).replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}
table{border-collapse:collapse;font-size:0.85em;margin-bottom:2em}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left}td.n{text-align:right}th{background:#f3f3f3}.note{color:#777;font-style:italic}figure{display:inline-block;margin:0.5em}
img{max-width:700px;border:1px solid #eee}pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;
font-size:0.85em;max-height:24em;overflow:auto}.wide{overflow-x:auto;max-width:100%}"""


# -- outputs ---------------------------------------------------------------------------------------------------

def _load(wh: Warehouse, run_id: str) -> tuple[dict, Tables]:
    """The run's summary and every table of the report: the views (`report_tables`), its training curve,
    evaluations and stage timings."""
    summary = q.run_summary(wh, run_id)
    if summary is None:
        raise ValueError(f"no run {run_id!r} in the warehouse {wh.path}; `sage status` lists the runs")
    if summary["status"] == "running" and (run_id, None, None) in dead_rows(wh):  # as `sage status` shows it
        summary["status"] = "dead (its process is gone; `sage status` says how to resume)"
    return summary, {**q.report_tables(wh, run_id), "admitted_questions": q.admitted_questions(wh, run_id),
                     "training_curve": q.training_curve(wh, run_id),
                     "admission_frontier": q.admission_frontier(wh, run_id),
                     "evaluations": q.evaluations(wh, run_id), "stage_timings": q.stage_timings(wh, run_id)}


#: The tables the page and the artifacts show, in order: validation and evaluations side by side. The
#: training curve's rows (one per optimizer step) are shown as its plot; `training_curve` in SQL has them all.
SHOWN = ("curriculum_drift", "admitted_questions", "role_rewards", "gate_stats", "validation_curve", "evaluations",
         "stage_timings")


def _config_text(wh: Warehouse, run_id: str) -> str:
    import json

    text = q.stored_config(wh, run_id) or "{}"
    return json.dumps(json.loads(text), indent=2, sort_keys=True)


def write_report(wh: Warehouse, run_id: str, out_dir: Path) -> Path:
    """Write one PNG per plot with data and `index.html` into `out_dir`; returns the HTML path."""
    summary, tables = _load(wh, run_id)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = []
    for stem, caption, plot, missing in PLOTS:
        fig = plot(tables)
        path = out_dir / f"{stem}.png"
        if fig is None:
            path.unlink(missing_ok=True)  # a stale plot from an earlier report must not survive
            figures.append(f'<figure><figcaption>{html.escape(caption)}</figcaption>'
                           f'<p class="note">skipped: {html.escape(missing)}</p></figure>')
            continue
        fig.savefig(path)
        figures.append(f'<figure><img src="{path.name}" alt="{html.escape(caption)}">'
                       f'<figcaption>{html.escape(caption)}</figcaption></figure>')
    meta = " · ".join(f"{k}: {html.escape(fmt(v))}" for k, v in summary.items() if k != "run_id")
    sections = "".join(f"<h2>{name}</h2>{html_table(tables[name])}" for name in SHOWN)
    iteration, samples = q.latest_samples(wh, run_id)
    heading = "sample generations" + (f" (iteration {iteration})" if iteration is not None else "")
    page = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>SAGE run {html.escape(run_id)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>SAGE run {html.escape(run_id)}</h1><p>{meta}</p>"
            f"<h2>Plots</h2>{''.join(figures)}{sections}<h2>{heading}</h2>{samples_html(samples)}"
            f"<h2>config</h2><pre>{html.escape(_config_text(wh, run_id))}</pre></body></html>")
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def report_artifacts(wh: Warehouse, run_id: str, images: bool = True) -> list[tuple[str, str]]:
    """(key, markdown) pairs for `prefect.artifacts.create_markdown_artifact`: one per shown table, the sample
    generations, the config, and with `images` one holding the plots as base64 PNG data URIs."""
    _, tables = _load(wh, run_id)
    out = [(artifact_key("sage", run_id, name), f"### {name} ({run_id})\n\n{markdown_table(tables[name])}")
           for name in SHOWN]
    iteration, samples = q.latest_samples(wh, run_id)
    out.append((artifact_key("sage", run_id, "samples"),
                samples_markdown(iteration, samples) if samples else f"### sample generations ({run_id})\n\n_none_"))
    config = fenced(_config_text(wh, run_id), limit=100_000)
    out.append((artifact_key("sage", run_id, "config"), f"### config ({run_id})\n\n{config}"))
    if images:
        parts = []
        for _, caption, plot, missing in PLOTS:
            fig = plot(tables)
            if fig is None:
                parts.append(f"**{caption}**: _skipped: {missing}_")
            else:
                data = base64.b64encode(_png_bytes(fig)).decode("ascii")
                parts.append(f"**{caption}**\n\n![{caption}](data:image/png;base64,{data})")
        out.append((artifact_key("sage", run_id, "plots"), f"### plots ({run_id})\n\n" + "\n\n".join(parts)))
    return out


__all__ = ["write_report", "report_artifacts", "PLOTS", "fmt"]
