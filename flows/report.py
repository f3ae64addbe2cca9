"""`sage report`: PNG plots and an HTML page of one run, from the warehouse's views only.

Plots (one PNG each, skipped with a note on the page when the run has no data for it): pool size per
iteration, admitted versus rejected by reason, mean s_q and difficulty of generated questions, mean reward
per role, the plan gate's pass rate, and the validation curve with the best checkpoint marked. The page
also shows the rows of `curriculum_drift`, `role_rewards`, `gate_stats` and `validation_curve` as tables.
`report_artifacts` gives the same content as Markdown for Prefect's `create_markdown_artifact`.

Matplotlib is used through `Figure` objects with the Agg canvas, never pyplot, so no global backend or
window state is touched (the flow may call this from a worker thread).
"""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime
from pathlib import Path
from typing import Callable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sage.flows.artifacts import artifact_key
from sage.warehouse.db import Warehouse
from sage.warehouse.report_queries import report_tables, run_summary

Tables = dict[str, list[dict]]
REJECTION_REASONS = ("low_quality", "invalid_verifier", "duplicate", "unparseable")


def _figure(title: str) -> tuple[Figure, object]:
    fig = Figure(figsize=(7, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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
    fig, ax = _figure("Pool size (seeds + admitted questions)")
    ax.plot(_column(rows, "iteration"), _column(rows, "pool_size"), marker="o")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("questions")
    return fig


def plot_admission(t: Tables) -> Figure | None:
    rows = t["curriculum_drift"]
    if not any((r.get("generated") or 0) > 0 for r in rows):
        return None
    fig, ax = _figure("Generated questions: admitted vs rejected by reason")
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
    ax.legend(fontsize="small")
    return fig


def plot_quality(t: Tables) -> Figure | None:
    rows = t["curriculum_drift"]
    if not _has(rows, "mean_s_q", "mean_difficulty"):
        return None
    fig, ax = _figure("Generated questions: mean quality s_q and difficulty")
    its = _column(rows, "iteration")
    for name, label in (("mean_s_q", "mean s_q (Critic, 0-1)"), ("mean_difficulty", "mean difficulty (1 - probe s_gt)")):
        if _has(rows, name):
            ax.plot(its, [float("nan") if v is None else v for v in _column(rows, name)], marker="o", label=label)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    return fig


def plot_role_rewards(t: Tables) -> Figure | None:
    rows = t["role_rewards"]
    if not _has(rows, "mean_reward"):
        return None
    fig, ax = _figure("Mean reward per role")
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
    fig, ax = _figure("Plan gate: share of plans shown to the Solver (s_p >= beta)")
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
    fig, ax = _figure("Validation accuracy (greedy pass@1)")
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


# (file stem, caption, plot function, what is missing when it is skipped)
PLOTS: tuple[tuple[str, str, Callable[[Tables], Figure | None], str], ...] = (
    ("pool_size", "Pool size per iteration", plot_pool_size, "no iterations recorded"),
    ("admission", "Admitted vs rejected by reason", plot_admission, "no generated questions"),
    ("quality", "Mean s_q and mean difficulty", plot_quality, "no scored generated questions"),
    ("role_rewards", "Mean reward per role", plot_role_rewards, "no scored rollouts"),
    ("gate", "Plan gate pass rate", plot_gate, "no plans judged"),
    ("validation", "Validation curve (best checkpoint starred)", plot_validation, "no validated checkpoints"),
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


def html_table(rows: list[dict]) -> str:
    if not rows:
        return '<p class="note">no rows</p>'
    cols = _visible(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(r[c]))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "_no rows_"
    cols = _visible(rows)
    cell = lambda v: fmt(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}
table{border-collapse:collapse;font-size:0.85em;margin-bottom:2em}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:right}th{background:#f3f3f3}.note{color:#777;font-style:italic}figure{display:inline-block;margin:0.5em}
img{max-width:700px;border:1px solid #eee}"""


# -- outputs ---------------------------------------------------------------------------------------------------

def _load(wh: Warehouse, run_id: str) -> tuple[dict, Tables]:
    summary = run_summary(wh, run_id)
    if summary is None:
        raise ValueError(f"no run {run_id!r} in the warehouse {wh.path}; `sage status` lists the runs")
    return summary, report_tables(wh, run_id)


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
    sections = "".join(f"<h2>{name}</h2>{html_table(rows)}" for name, rows in tables.items())
    page = (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>SAGE run {html.escape(run_id)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>SAGE run {html.escape(run_id)}</h1><p>{meta}</p>"
            f"<h2>Plots</h2>{''.join(figures)}{sections}</body></html>")
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def report_artifacts(wh: Warehouse, run_id: str, images: bool = True) -> list[tuple[str, str]]:
    """(key, markdown) pairs for `prefect.artifacts.create_markdown_artifact`: one per view table, and with
    `images` one holding the plots as base64 PNG data URIs."""
    _, tables = _load(wh, run_id)
    out = [(artifact_key("sage", run_id, name), f"### {name} ({run_id})\n\n{markdown_table(rows)}")
           for name, rows in tables.items()]
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
