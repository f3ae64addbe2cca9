"""experiments/learning.py's results: the measures cache (`measures.json`), and the table and curves made from it.

`measures.json` keeps every measure of every iteration with the parameters it was taken with, so a resumed
run computes only what is missing; `learning.csv`, `learning.md` and the PNG curves are rewritten from it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

ROLES = ("challenger", "planner", "critic", "solver")
MEASURES = ("validation", "signal", "kl", "logprob", "format", "timing")


class Cache:
    """measures.json: {run_id, iterations: {k: {measure: {params, value, seconds}}}, invocations: [...]},
    rewritten after each measure."""

    def __init__(self, path: Path, run_id: str):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {"run_id": run_id, "iterations": {}}
        if self.data["run_id"] != run_id:
            raise SystemExit(f"{path} holds run {self.data['run_id']!r}, this config is run {run_id!r}: "
                             f"give another --out")

    def get(self, k: int, name: str, params: dict) -> dict | None:
        entry = self.data["iterations"].get(str(k), {}).get(name)
        return entry if entry is not None and entry["params"] == params else None

    def put(self, k: int, name: str, params: dict, value: dict, seconds: float) -> None:
        self.data["iterations"].setdefault(str(k), {})[name] = {"params": params, "value": value, "seconds": seconds}
        self._save()

    def log(self, invocation: dict) -> None:
        """Record one invocation's command and time, finished or interrupted (the header sums them over a resumed
        run)."""
        self.data.setdefault("invocations", []).append(invocation)
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))  # key order is column order
        tmp.replace(self.path)

    def rows(self) -> tuple[list[str], list[dict]]:
        """(columns, one row per iteration): every measure's values, then each measure's seconds."""
        its = sorted(self.data["iterations"].items(), key=lambda kv: int(kv[0]))
        columns, rows = ["iteration"], [{"iteration": int(k)} for k, _ in its]
        for name in MEASURES:
            for (_, entry), row in zip(its, rows):
                for key, v in entry.get(name, {}).get("value", {}).items():
                    row[key] = v
                    columns += [key] if key not in columns else []
        for name in MEASURES[:-1]:
            columns.append(f"{name}_seconds")
            for (_, entry), row in zip(its, rows):
                row[f"{name}_seconds"] = entry.get(name, {}).get("seconds")
        return columns, rows


def cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
    return str(v)


def write_outputs(out: Path, cache: Cache, header) -> None:
    columns, rows = cache.rows()
    with (out / "learning.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    lines = header(cache) + ["", "| measure | " + " | ".join(f"k={r['iteration']}" for r in rows) + " |",
                      "|---|" + "---:|" * len(rows)]
    lines += [f"| {c} | " + " | ".join(cell(r.get(c)) for r in rows) + " |" for c in columns[1:]]
    (out / "learning.md").write_text("\n".join(lines) + "\n")
    plot(out, rows)


def kept_iteration(rows: list[dict]) -> int | None:
    """The checkpoint early stopping keeps, by the run's own rule (`flows.evolve.stop_decision`: the best
    validation pass@1, the earliest on ties); rows in iteration order."""
    from sage.flows.evolve import stop_decision

    history = [(r["iteration"], r["val_pass1"]) for r in rows if r.get("val_pass1") is not None]
    return stop_decision(history, patience=len(history)).best_iteration


def plot(out: Path, rows: list[dict]) -> None:
    from sage.flows.report import iteration_figure

    def figure(name: str, title: str, series: dict[str, str], band: tuple[str, str] | None = None,
               share: bool = True, mark: int | None = None) -> None:
        fig, ax = iteration_figure(title)
        if share:  # a share of rollouts or outputs: the whole range, so iterations compare at a glance
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlim(-0.3, max(r["iteration"] for r in rows) + 0.3)
        for (label, key), marker in zip(series.items(), "osD^"):  # markers tell apart lines that coincide
            pts = [(r["iteration"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker=marker, markersize=9 - 1.5 * "osD^".index(marker), alpha=0.8, label=label)
        if band:
            pts = [(r["iteration"], r[band[0]], r[band[1]]) for r in rows if r.get(band[0]) is not None]
            if pts:
                ax.fill_between(*zip(*pts), alpha=0.2, label="95% Wilson")
        if mark is not None:  # the kept checkpoint of the first series
            key = next(iter(series.values()))
            y = next(r[key] for r in rows if r["iteration"] == mark)
            ax.plot([mark], [y], marker="*", markersize=18, color="black", linestyle="none",
                    label=f"kept (iteration {mark})")
        if not share:
            ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.savefig(out / f"{name}.png")

    figure("pass1", "validation pass@1 (greedy)", {"pass@1": "val_pass1"}, ("val_ci_lo", "val_ci_hi"),
           share=False, mark=kept_iteration(rows))
    figure("nonzero_advantage", "share of rollouts with a non-zero advantage",
           {role: f"{role}_nonzero_adv" for role in ROLES})
    figure("kl", "mean per-token KL(adapter || base) on base validation answers", {"KL": "kl_mean"}, share=False)
    figure("format", "well-formed share (r_f = 1), sampled without the grammar",
           {role: f"format_{role}_rate" for role in ROLES})
