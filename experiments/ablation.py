"""Does self-play add anything? The paper's ablations of the loop, each a learning run drawn like the full loop's.

    .venv/bin/python -m experiments.ablation [--iterations 10] [--seeds 0 1 2] [--rows ROW ...]
        [--seeded-rows full solver-alone] [--config cpu] [--model tiny] [--out DIR] [--report]

Each row is `experiments.learning` on the config with the row's `--set` overrides (`ROWS`), in a folder of its
own (`DIR/seed-S/ROW`), with the same run id (`ablation-sS`) and run seed (`run.seed=S`) for every row of seed
S, so every row draws its samples from the same seeds and only the ablated part differs; the seed pool and the
validation set (`seeds.seed`) are the config's, the same for every row and every run seed. Rows run one after
the other (`--seeds` in turn; the rows of `--seeded-rows` only for seeds after the first); each is resumable, so
rerunning the command continues where it stopped and redoes nothing done. After its run, each row's kept checkpoint
and the base model answer the fixed out-of-distribution set (`experiments.heldout --ood`; `experiments/ood.py`).
While a row runs, the machine's load average is sampled every 30 s into the row's `load.json`, so its CPU time
can be read against what ran beside it.

Then, and with `--report` alone, it writes `DIR/ablation.md` and `ablation.json`: per run seed and row, the kept
checkpoint (the run's own rule: the best validation pass@1, the earliest on ties), its pass@1 with a 95% Wilson
interval, the exact McNemar test against the base model and against the full loop's kept checkpoint on the same
problems, the same on the out-of-distribution set, the row's stage seconds (every iteration's stages and
validation) and the CPU and wall time of its logged invocations (`measures.json`), and the load beside it;
a section across the run seeds (the study's goal: in how many seeds the full loop beats the Solver alone out of
distribution with p < 0.05, and whether any other row beats the full loop; each row's mean, min and max); and a
curve of validation pass@1 per iteration for every row (`ablation.png`). Each entry of `ablation.json` keeps the kept
checkpoint's verdict per problem, so a row whose run folder was deleted keeps its entry and later rows are still
compared with its full loop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from experiments.learning import mcnemar_exact, wilson

#: `hints`' overrides, which the curriculum rows build on
#: `cpu.yaml`'s loop before it took plans as hints, the one every row was measured against: each row's overrides go on
#: top of these, so `full` stays the full loop of the stored entries (and their run ids) whatever `cpu.yaml` says now
BASELINE = ["iteration.hints=always", "train.hinted_prompt=shown", "rewards.solver_plan=0.2", "rewards.solver_gt=0.6",
            "train.loss_weighting=role_mean"]
HINTS = ["iteration.hints=mixed", "iteration.hint_share=0.5", "train.hinted_prompt=plain", "rewards.solver_plan=0",
         "rewards.solver_gt=0.8", "train.loss_weighting=role_share"]
#: the out-of-distribution set as test problems no run may train on (`seeds.heldout`; a path from the repository root,
#: where the studies run)
GUARD = ["seeds.heldout=[experiments/ood_math.jsonl]"]

#: name: (what the row changes, its `--set` overrides on the config). `cpu.yaml` trains the Solver and the Planner,
#: so "no Solver training" trains the Planner alone; "Solver alone" is plain RLVR on the seed pool with the same
#: updates (one pass over an iteration's rows, ceil(rows / 8) AdamW updates, the same learning rate and batch).
ROWS: dict[str, tuple[str, list[str]]] = {
    "full": ("the full loop", []),
    "solver-alone": ("Solver alone on the seed pool: no Challenger, no Planner, only the Solver trains",
                     ["iteration.challenger=false", "iteration.planner=false", "train.roles=[solver]"]),
    "no-challenger": ("no Challenger: the pool stays the seeds", ["iteration.challenger=false"]),
    "no-planner": ("no Planner: the Solver answers without plans", ["iteration.planner=false"]),
    "no-plan-gate": ("no plan gate: beta = 0, every plan shown", ["iteration.beta=0"]),
    "no-solver-training": ("no Solver training: the Planner's rollouts alone train", ["train.roles=[planner]"]),
    # not an ablation: a candidate change to the loop the first seeds pointed to (docs/learning.md), run against
    # the same baseline. The Planner still writes plans the Solver sees and is rewarded on; its rollouts leave the
    # shared adapter's update, which then is the Solver's alone.
    "untrained-planner": ("the full loop, the Planner's rollouts out of the update (`train.roles=[solver]`)",
                          ["train.roles=[solver]"]),
    # the next candidate: the Solver rewarded for its answer and format only, so the Critic's score of the plan it
    # was shown no longer raises or lowers every answer to a question alike
    "unrewarded-plan": ("the full loop, the plan's score out of the Solver's reward (`rewards.solver_plan=0`)",
                        ["rewards.solver_plan=0", "rewards.solver_gt=0.8"]),
    # plans as hints: the Solver trains on the prompt it is tested on. Half of a passed plan's answers see it, in one
    # TRR++ group with the plain ones; the shown ones train on the plain prompt with the plan's sampler as pi_old
    # (Guide); the plan's score out of the Solver's reward. The roles weigh over the whole pass (role_share)
    "hints": ("the full loop with plans as hints: half of a passed plan's answers see it and train on the plain "
              "prompt, the plan's score out of the Solver's reward",
              HINTS),
    # one change each, to tell the parts of `hints` apart: the roles weighed over the whole pass; hints only where the
    # plain answers all failed (Guide's adaptive hints) with the rest of `hints`
    "role-share": ("the full loop, each role weighed over the whole pass (`train.loss_weighting=role_share`)",
                   ["train.loss_weighting=role_share"]),
    "hints-on-failure": ("`hints` with a plan shown only to questions whose plain answers all failed",
                         ["iteration.hints=on_failure", "iteration.hint_share=0.5", "train.hinted_prompt=plain",
                          "rewards.solver_plan=0", "rewards.solver_gt=0.8", "train.loss_weighting=role_share"]),
    # roles that cannot drag the Solver: each trained role its own adapter on the frozen backbone, the untrained
    # ones (cpu.yaml: the Challenger and the Critic) the base model; alone, then with the hints-on-failure loop
    "role-adapters": ("the full loop, each role its own LoRA adapter (`train.adapters=per_role`)",
                      ["train.adapters=per_role"]),
    "adapters-hints-on-failure": ("`hints-on-failure` with each role its own LoRA adapter",
                                  ["iteration.hints=on_failure", "iteration.hint_share=0.5",
                                   "train.hinted_prompt=plain", "rewards.solver_plan=0", "rewards.solver_gt=0.8",
                                   "train.loss_weighting=role_share", "train.adapters=per_role"]),
    # the curriculum at the Solver's frontier, each step on `hints` (docs/decisions.md): half of the Solver's
    # questions from the admitted ones, newest first, the out-of-distribution set guarded; then admission in R-Zero's
    # band on eight probes; then the Challenger trained on R-Zero's reward, which pays most at p = 0.5
    "curriculum": ("`hints` with half the Solver's questions admitted ones (`iteration.generated_share=0.5`)",
                   [*HINTS, *GUARD, "iteration.generated_share=0.5"]),
    "frontier": ("`curriculum` admitting probe pass rates in 0.3-0.7 on eight probes",
                 [*HINTS, *GUARD, "iteration.generated_share=0.5", "iteration.n_probe=8", "iteration.admission=band"]),
    "frontier-challenger": ("`frontier` with the Challenger trained on R-Zero's uncertainty reward",
                            [*HINTS, *GUARD, "iteration.generated_share=0.5", "iteration.n_probe=8",
                             "iteration.admission=band", "rewards.challenger_difficulty=uncertainty",
                             "train.roles=[solver,planner,challenger]"]),
}
#: the rows that are candidate changes to the loop, not ablations: run only when named in `--rows`
CANDIDATES = {"untrained-planner", "unrewarded-plan", "hints", "role-share", "hints-on-failure", "role-adapters",
              "adapters-hints-on-failure", "curriculum", "frontier", "frontier-challenger"}
#: the rows the command runs by default: the paper's ablations and the baseline
ABLATIONS = [r for r in ROWS if r not in CANDIDATES]
LOAD_EVERY_S = 30


def row_dir(out: Path, seed: int, row: str) -> Path:
    return out / f"seed-{seed}" / row


def plan(seeds: list[int], rows: list[str], seeded: list[str]) -> list[tuple[int, str]]:
    """The (seed, row) runs in order: every row for the first seed, then the seeded rows for each later one."""
    return [(seeds[0], r) for r in rows] + [(s, r) for s in seeds[1:] for r in rows if r in seeded]


def learning_command(args, seed: int, row: str) -> list[str]:
    sets = [f"run.seed={seed}", *(BASELINE if args.config == "cpu" else []), *ROWS[row][1]]
    return [sys.executable, "-m", "experiments.learning", "--iterations", str(args.iterations), "--config",
            args.config, "--model", args.model, "--kl-sequences", str(args.kl_sequences), "--run", f"ablation-s{seed}",
            "--out", str(row_dir(args.out, seed, row)), *[a for s in sets for a in ("--set", s)]]


def _sample_load(path: Path, stop: threading.Event) -> None:
    """Append (time, 1-minute load average) to `path` every LOAD_EVERY_S until `stop`."""
    samples = json.loads(path.read_text()) if path.exists() else []
    while True:
        samples.append([round(time.time()), round(os.getloadavg()[0], 2)])
        path.write_text(json.dumps(samples))
        if stop.wait(LOAD_EVERY_S):
            return


def run_row(args, seed: int, row: str) -> int:
    """One row's learning run (resuming it), with the load sampled beside it; its exit status."""
    folder = row_dir(args.out, seed, row)
    folder.mkdir(parents=True, exist_ok=True)
    command = learning_command(args, seed, row)
    print(f"[ablation] seed {seed}, {row}: {' '.join(command[1:])}", flush=True)
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_load, args=(folder / "load.json", stop), daemon=True)
    sampler.start()
    try:
        code = subprocess.run(command, check=False).returncode
        if code == 0:
            code = subprocess.run(ood_command(folder), check=False).returncode
        return code
    finally:
        stop.set()
        sampler.join()


def ood_command(folder: Path) -> list[str]:
    """`experiments.heldout --ood` on the row's kept checkpoint and its last one (the run-level comparison is at a
    fixed iteration; the last alone when validation kept the base model); it answers only what is missing."""
    r = _read_row(folder)
    last = max((r or {}).get("outcomes", {0: {}}))
    scored = sorted({k for k in ((r or {}).get("kept"), last) if k})
    return [sys.executable, "-m", "experiments.heldout", "--out", str(folder), "--ood",
            *[a for k in scored for a in ("--iteration", str(k))]]


# -- the table ---------------------------------------------------------------------------------------------------
def _verdicts(path: Path) -> dict[int, dict[str, bool]]:
    """Every validated iteration's verdict per problem in the warehouse at `path` ({} when it is missing, or held
    by a running process and has no snapshot)."""
    from experiments.learning import outcomes
    from sage.warehouse import Warehouse, WarehouseBusy, snapshot_path

    if not path.exists():
        return {}
    try:
        wh = Warehouse.open(path, read_only=True)
    except WarehouseBusy:
        if not snapshot_path(path).exists():
            return {}
        wh = Warehouse.open(snapshot_path(path), read_only=True)
    with wh:
        run_id = wh.scalar("SELECT run_id FROM runs ORDER BY run_id LIMIT 1")
        done = [r["iteration"] for r in wh.rows(
            "SELECT DISTINCT iteration FROM rollouts WHERE run_id = ? AND purpose = 'validate' ORDER BY 1", [run_id])]
        verdicts = {k: {q: p for q, (_, p) in outcomes(wh, run_id, k).items()} for k in done}
    return {k: v for k, v in verdicts.items() if v}


def _read_row(folder: Path) -> dict | None:
    """A row's validation verdicts per iteration and problem, its kept checkpoint, its out-of-distribution
    verdicts (`experiments.heldout --ood`: the base model's and the kept checkpoint's), time and load; None when
    the row has not validated anything yet."""
    from experiments.learning_report import kept_iteration

    outcomes = _verdicts(folder / "warehouse.duckdb")
    if 0 not in outcomes:
        return None
    history = [{"iteration": k, "val_pass1": sum(v.values()) / len(v)} for k, v in sorted(outcomes.items())]
    measures = json.loads((folder / "measures.json").read_text()) if (folder / "measures.json").exists() else {}
    runs = measures.get("invocations", [])
    load = json.loads((folder / "load.json").read_text()) if (folder / "load.json").exists() else []
    return {"outcomes": outcomes, "history": history, "kept": kept_iteration(history),
            "ood": _verdicts(folder / "heldout-ood" / "warehouse.duckdb"),
            "cpu_s": sum(r["cpu_s"] for r in runs), "wall_s": sum(r["wall_s"] for r in runs),
            # the stages' own seconds, from the warehouse through the per-iteration timing measure: complete even
            # where an invocation went unlogged (before interrupted ones were logged)
            "stage_s": sum(t["value"].get("sage_seconds", 0) + t["value"].get("validate_seconds", 0)
                           for t in (m.get("timing") for m in measures.get("iterations", {}).values()) if t),
            "load": [x for _, x in load]}


def _paired(now: dict[str, bool], other: dict[str, bool]) -> tuple[int, int, float]:
    """b (other right, now wrong), c (the reverse) and the exact McNemar p on the problems both answered."""
    common = now.keys() & other.keys()
    b = sum(other[q] and not now[q] for q in common)
    c = sum(now[q] and not other[q] for q in common)
    return b, c, mcnemar_exact(b, c)


def summarise(out: Path, seeds: list[int], rows: list[str]) -> dict:
    """Every row's kept checkpoint against the base model and the full loop, per seed. A row whose run folder is
    gone (its adapters take hundreds of MB) keeps its entry from the last `DIR/ablation.json`; an entry holds its
    kept checkpoint's verdicts per problem, so later rows are still compared with a full loop read from there."""
    recorded = json.loads((out / "ablation.json").read_text()) if (out / "ablation.json").exists() else {}
    table = {}
    for seed in seeds:
        read = {row: _read_row(row_dir(out, seed, row)) for row in rows}
        full = read.get("full")
        if full is not None:
            full_verdicts = {"validation": full["outcomes"][full["kept"]], "ood": full["ood"].get(full["kept"])}
        else:
            full_verdicts = recorded.get(f"{seed}/full", {}).get("verdicts", {})
        for row, r in read.items():
            key = f"{seed}/{row}"
            if r is None:
                if key in recorded:
                    table[key] = {**recorded[key], "carried": True}
                continue
            kept = r["kept"]
            now, base = r["outcomes"][kept], r["outcomes"][0]
            passed = sum(now.values())
            entry = {"seed": seed, "row": row, "change": ROWS[row][0], "iterations": len(r["history"]) - 1,
                     "kept": kept, "pass1": passed / len(now), "n": len(now), "ci": wilson(passed, len(now)),
                     "base": sum(base.values()) / len(base), "vs_base": _paired(now, base),
                     "curve": [h["val_pass1"] for h in r["history"]], "cpu_s": r["cpu_s"], "wall_s": r["wall_s"],
                     "stage_s": r["stage_s"], "load_mean": sum(r["load"]) / len(r["load"]) if r["load"] else None,
                     "load_max": max(r["load"], default=None)}
            if full_verdicts.get("validation") and row != "full":
                entry["vs_full"] = _paired(now, full_verdicts["validation"])
            ood = r["ood"]
            if kept in ood and 0 in ood:
                entry["ood"] = sum(ood[kept].values()) / len(ood[kept])
                entry["ood_n"], entry["ood_base"] = len(ood[kept]), sum(ood[0].values()) / len(ood[0])
                entry["ood_vs_base"] = _paired(ood[kept], ood[0])
                if full_verdicts.get("ood") and row != "full":
                    entry["ood_vs_full"] = _paired(ood[kept], full_verdicts["ood"])
            entry["ood_curve"] = {str(k): sum(v.values()) / len(v) for k, v in sorted(ood.items())}
            entry["verdicts"] = {"validation": now, "ood": ood.get(kept)}
            table[key] = entry
    return table


def write_report(out: Path, table: dict, command: str) -> None:
    lines = ["# Ablations of the loop", "", f"- command: `.venv/bin/python -m experiments.ablation {command}`",
             "- each row: `experiments.learning` with the row's overrides, run id `ablation-sS`, `run.seed=S`; "
             "kept = the best validation pass@1 (earliest on ties); b / c: problems the other got right and this "
             "one wrong / the reverse; p: exact McNemar", "",
             "| seed | row | the change | iterations | kept: pass@1 [95% Wilson] | vs base: b / c, p | "
             "vs full: b / c, p | out of distribution: kept [95% Wilson] | OOD vs base: b / c, p | "
             "OOD vs full: b / c, p | stage s | CPU s (wall s) logged | load mean / max |",
             "|---:|---|---|---:|---|---|---|---|---|---|---:|---|---|"]

    def paired(e: dict, key: str) -> str:
        return "" if key not in e else "{} / {}, {:.2g}".format(*e[key])

    for e in table.values():
        lo, hi = e["ci"]
        load = "" if e["load_mean"] is None else f"{e['load_mean']:.1f} / {e['load_max']:.1f}"
        ood = ""
        if "ood" in e:
            olo, ohi = wilson(round(e["ood"] * e["ood_n"]), e["ood_n"])
            ood = f"{e['ood']:.3f} [{olo:.2f}, {ohi:.2f}] (base {e['ood_base']:.3f}, n {e['ood_n']})"
        lines.append(f"| {e['seed']} | {e['row']} | {e['change']} | {e['iterations']} | it {e['kept']}: "
                     f"{e['pass1']:.3f} [{lo:.2f}, {hi:.2f}] (base {e['base']:.3f}) | {paired(e, 'vs_base')} | "
                     f"{paired(e, 'vs_full')} | {ood} | {paired(e, 'ood_vs_base')} | {paired(e, 'ood_vs_full')} | "
                     f"{e['stage_s']:.0f} | {e['cpu_s']:.0f} ({e['wall_s']:.0f}) | {load} |")
    carried = [k for k, e in table.items() if e.get("carried")]
    if carried:
        lines += ["", "Carried over from the previous `ablation.json` (their run folders are gone): "
                  f"{', '.join(carried)}."]
    at = max((e["iterations"] for e in table.values()), default=0)
    lines += ["", *run_level_lines(table, at), "", *across_seeds(table)]
    (out / "ablation.md").write_text("\n".join(lines) + "\n\n![validation pass@1 per iteration](ablation.png)\n")
    (out / "ablation.json").write_text(json.dumps(table, indent=1))
    _plot(out, table)


def _beats(e: dict, key: str, alpha: float = 0.05) -> int:
    """+1 where the row beats the other with exact McNemar p < alpha (c > b), -1 where it loses so, else 0 (b = c
    gives p = 1)."""
    if key not in e:
        return 0
    b, c, p = e[key]
    return 0 if p >= alpha else (1 if c > b else -1)


def run_level(table: dict, row: str, at: int, baseline: str = "solver-alone") -> dict:
    """`row` against `baseline` at iteration `at` with the run seed as the unit: per seed both ran, the difference of
    their pass@1 on validation and, where both scored iteration `at` out of distribution, on the OOD set; per
    measure its mean, the paired t-test across seeds (two-sided; df = seeds - 1) and the 95% t interval of the mean
    difference. With three seeds an exact sign-flip test cannot go below p = 0.25, so the t-test is what can speak,
    and it assumes the differences are roughly normal."""
    from scipy import stats

    by_seed = {e["seed"]: e for e in table.values() if e["row"] == row}
    base = {e["seed"]: e for e in table.values() if e["row"] == baseline}
    out = {}
    for measure in ("validation", "ood"):
        diffs = {}
        for seed in sorted(by_seed.keys() & base.keys()):
            a, b = by_seed[seed], base[seed]
            if measure == "validation":
                if len(a["curve"]) > at and len(b["curve"]) > at:
                    diffs[seed] = a["curve"][at] - b["curve"][at]
            elif str(at) in a.get("ood_curve", {}) and str(at) in b.get("ood_curve", {}):
                diffs[seed] = a["ood_curve"][str(at)] - b["ood_curve"][str(at)]
        d = list(diffs.values())
        result = {"seeds": list(diffs), "diffs": d, "mean": sum(d) / len(d) if d else None, "p": None, "ci": None}
        if len(d) >= 2 and len(set(d)) > 1:  # the paired t-test is the one-sample test of the differences
            half = stats.t.ppf(0.975, len(d) - 1) * stats.tstd(d) / len(d) ** 0.5
            result.update(p=float(stats.ttest_1samp(d, 0.0).pvalue), ci=(result["mean"] - half, result["mean"] + half))
        out[measure] = result
    return out


def run_level_lines(table: dict, at: int) -> list[str]:
    """The primary comparison: every row against the Solver alone at iteration `at`, the run seed as the unit."""
    rows = [r for r in dict.fromkeys(e["row"] for e in table.values()) if r != "solver-alone"]
    lines = [f"## Against the Solver alone at iteration {at}, across run seeds (the primary comparison)", "",
             f"Per seed the difference of pass@1 at iteration {at} (this row minus the Solver alone), its mean over "
             "the seeds both ran, the 95% t interval and the paired t-test across seeds (the seed is the unit; with "
             "three seeds an exact sign-flip test cannot go below p = 0.25). The kept checkpoints above are the best "
             "of six validations, so their comparisons are secondary and optimistic.", "",
             "| row | measure | seeds | differences | mean [95% t] | paired t-test p |", "|---|---|---|---|---|---|"]
    for row in rows:
        for measure, r in run_level(table, row, at).items():
            if not r["seeds"]:
                continue
            ci = "" if r["ci"] is None else f" [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]"
            p = "" if r["p"] is None else f"{r['p']:.2g}"
            lines.append(f"| {row} | {measure} | {', '.join(map(str, r['seeds']))} | "
                         f"{', '.join(f'{x:+.3f}' for x in r['diffs'])} | {r['mean']:+.3f}{ci} | {p} |")
    return lines


def across_seeds(table: dict) -> list[str]:
    """The study's goal read off the table: in how many run seeds the full loop beats the Solver-alone baseline
    out of distribution with p < 0.05, and whether any other row beats the full loop (in distribution or out of
    it, p < 0.05); then each row's mean over the seeds it ran. A row still at its base model is left out."""
    table = {k: e for k, e in table.items() if e["iterations"] > 0}
    alone = [e for e in table.values() if e["row"] == "solver-alone" and "ood_vs_full" in e]
    wins = [e["seed"] for e in alone if _beats(e, "ood_vs_full") == -1]
    beaten = [f"{e['seed']}/{e['row']} ({where})" for e in table.values()
              for key, where in (("vs_full", "validation"), ("ood_vs_full", "out of distribution"))
              if _beats(e, key) == 1]
    lines = ["## Across seeds", "",
             f"- the full loop beats the Solver alone out of distribution with p < 0.05 in {len(wins)} of "
             f"{len(alone)} run seed(s) scored{' (' + ', '.join(map(str, wins)) + ')' if wins else ''}; "
             f"the goal is at least two of three",
             "- a row beats the full loop with p < 0.05: " + (", ".join(beaten) if beaten else "none"), "",
             "| row | seeds | kept validation pass@1: mean (min - max) | out of distribution: mean (min - max) |",
             "|---|---:|---|---|"]
    rows: dict[str, list[dict]] = {}
    for e in table.values():
        rows.setdefault(e["row"], []).append(e)

    def spread(values: list[float]) -> str:
        return "" if not values else f"{sum(values) / len(values):.3f} ({min(values):.3f} - {max(values):.3f})"

    for row, es in rows.items():
        lines.append(f"| {row} | {len(es)} | {spread([e['pass1'] for e in es])} | "
                     f"{spread([e['ood'] for e in es if 'ood' in e])} |")
    return lines


def _plot(out: Path, table: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {row: f"C{i}" for i, row in enumerate(ROWS)}  # one colour a row, one line style a seed
    styles = ["-", "--", ":", "-."]
    for key, e in table.items():
        if e["iterations"] == 0:  # a row still at its base model has no curve yet (as across_seeds leaves it out)
            continue
        ax.plot(range(len(e["curve"])), e["curve"], marker="o", markersize=3, label=key, color=colours[e["row"]],
                linestyle=styles[e["seed"] % len(styles)])
    ax.set_xlabel("iteration (0 = base model)")
    ax.set_ylabel("validation pass@1")
    ax.set_title("Ablations: validation pass@1 per iteration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, handlelength=4)  # long enough to show a seed's dashes
    fig.tight_layout()
    fig.savefig(out / "ablation.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", "-n", type=int, default=10)
    ap.add_argument("--config", "-c", default="cpu", help="profile name or YAML path (default cpu)")
    ap.add_argument("--model", choices=["config", "tiny"], default="config",
                    help="passed to experiments.learning (tiny: the tiny random test model, a smoke test)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="run seeds, the first for every row")
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=ABLATIONS,
                    help="rows, in this order (default: the ablations; the candidate changes to the loop, "
                    f"{' and '.join(sorted(CANDIDATES))}, run only when named)")
    ap.add_argument("--seeded-rows", nargs="+", choices=list(ROWS), default=["full", "solver-alone"],
                    help="the rows also run for the seeds after the first")
    ap.add_argument("--kl-sequences", type=int, default=10, help="passed to experiments.learning")
    ap.add_argument("--out", type=Path, default=Path("sage-runs/ablation"))
    ap.add_argument("--report", action="store_true", help="only write the table from what has run")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for seed, row in plan(args.seeds, args.rows, args.seeded_rows):
            code = run_row(args, seed, row)
            if code != 0:
                print(f"[ablation] seed {seed}, {row} ended with status {code}; rerun the command to continue",
                      flush=True)
                if code in (130, -2, -15):
                    raise SystemExit(code)
            write_report(args.out, summarise(args.out, args.seeds, args.rows), " ".join(sys.argv[1:]))
    write_report(args.out, summarise(args.out, args.seeds, args.rows), " ".join(sys.argv[1:]))
    print((args.out / "ablation.md").read_text())


if __name__ == "__main__":
    main()
