"""`sage eval`: the base model and checkpoints of a run on benchmarks, as a Prefect flow, side by side.

One task per benchmark: its problems load once (code references run in the sandbox), then each checkpoint
is evaluated on them. Every checkpoint name resolves before anything generates. Rows land in `evaluations` (see stages/evaluate.py for
the id and what is stored); asking again for a stored evaluation generates nothing and shows the stored
numbers. Without a run, the base model of `--config/--set` is evaluated (rows with run_id NULL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from prefect import flow, task
from prefect.cache_policies import NONE

from sage.configs import ConfigError, load_config
from sage.configs.schema import SageConfig
from sage.flows import session
from sage.stages import evaluate as evaluate_stage
from sage.warehouse.checkpoints import resolve_checkpoint
from sage.warehouse.eval_queries import evaluations_by_id

DEFAULT_CHECKPOINTS = ("base", "best")
DEFAULT_BENCHMARKS = ("humaneval", "math500")


def eval_config(s: session.Session, run_id: str | None, config: str = "cpu",
                overrides: list[str] | None = None) -> SageConfig:
    """A run's stored config (plus `overrides`, e.g. model.backend=vllm), or the profile `config` without a run."""
    if run_id is None:
        return load_config(config, overrides or [])
    return s.run_config(run_id, overrides or [])


def default_ks(n: int) -> list[int]:
    """pass@1, @5, @10 where n allows, and pass@n."""
    return sorted({k for k in (1, 5, 10) if k <= n} | {n}) if n > 1 else []


@task(task_run_name="evaluate-{benchmark}", cache_policy=NONE)
def evaluate_task(directory: str, run_id: Optional[str], benchmark: str, checkpoints: list[str], limit: Optional[int],
                  n: int, ks: list[int], config: str, overrides: Optional[list[str]]) -> list[tuple[str, str]]:
    """One benchmark for each checkpoint (its problems load once): (eval_id, checkpoint label) of every row."""
    with session.opened(directory) as s:
        cfg = eval_config(s, run_id, config, overrides)
        ctx = s.context_for(cfg, run_id)
        problems = evaluate_stage.load_problems(ctx, benchmark, limit)
        out = []
        for name in checkpoints:
            target = resolve_checkpoint(s.warehouse, run_id, name)
            ctx.adapter = target.adapter
            out += [(row_id, target.label)
                    for row_id in evaluate_stage.run(ctx, target, benchmark, problems, n=n, ks=ks).info["eval_ids"]]
        return out


@flow(name="sage-eval", flow_run_name="eval-{run_id}")
def eval_flow(directory: str, run_id: Optional[str] = None, checkpoints: list[str] = list(DEFAULT_CHECKPOINTS),
              benchmarks: list[str] = list(DEFAULT_BENCHMARKS), limit: Optional[int] = None, n: int = 1,
              k: Optional[list[int]] = None, config: str = "cpu", overrides: Optional[list[str]] = None) -> list[dict]:
    """Evaluate each checkpoint ('base', 'best', 'latest', an iteration) on each benchmark (`name` or
    `name=local-file`): greedy pass@1, plus pass@k over n samples when n > 1. Returns the `evaluations`
    rows it stands for, each with a `label` (checkpoint as asked) and `setting` (greedy or sampled)."""
    ks = sorted(set(k)) if k else default_ks(n)
    with session.opened(directory) as s:
        for name in checkpoints:  # every name resolves before anything is generated
            resolve_checkpoint(s.warehouse, run_id, name)
        labels: dict[str, list[str]] = {}  # 'best' and 'latest' may name the same adapter: one row, two columns
        for spec in benchmarks:
            for row_id, label in evaluate_task(directory, run_id, spec, checkpoints, limit, n, ks, config, overrides):
                labels.setdefault(row_id, []).append(label)
        stored = evaluations_by_id(s.warehouse, list(labels))
    rows = []
    for r in stored:
        decoding = r["decoding"]
        setting = "greedy" if decoding["samples"] == 1 else f"n={decoding['samples']} T={decoding['temperature']:g}"
        rows += [{**r, "label": label, "setting": setting} for label in labels[r["eval_id"]]]
    return rows


def side_by_side(rows: list[dict]) -> list[dict]:
    """One row per (benchmark, metric, setting), one column per checkpoint label, in the order asked."""
    columns = list(dict.fromkeys(r["label"] for r in rows))
    table: dict[tuple, dict] = {}
    for r in rows:
        key = (r["benchmark"], r["metric"], r["setting"])
        line = table.setdefault(key, {"benchmark": r["benchmark"], "metric": f"{r['metric']} ({r['setting']})",
                                      "problems": r["n"], **{c: None for c in columns}})
        line[r["label"]] = r["value"]
    order = {b: i for i, b in enumerate(dict.fromkeys(r["benchmark"] for r in rows))}
    return sorted(table.values(), key=lambda x: (order[x["benchmark"]], x["metric"] != "pass@1 (greedy)",
                                                 int(x["metric"].split("@")[1].split()[0])))



def eval_command(
        run_id: Annotated[Optional[str], typer.Option("--run", help="Run whose checkpoints to evaluate (see `sage status`); without it only the base model of --config.")] = None,
        checkpoint: Annotated[Optional[list[str]], typer.Option("--checkpoint", help="base, best, latest or an iteration number (repeatable; default: base and best, or base without --run).")] = None,
        benchmark: Annotated[Optional[list[str]], typer.Option("--benchmark", "-b", help="humaneval, math500, aime, gsm8k, mbppplus, olympiadbench, livecodebench; a hub set may name a local file: gsm8k=test.jsonl (repeatable; default: humaneval and math500).")] = None,
        limit: Annotated[Optional[int], typer.Option("--limit", help="Evaluate only the first N problems of each benchmark.")] = None,
        n: Annotated[int, typer.Option("--n", min=1, help="Samples per problem for pass@k (at roles.solver temperature); 1 = greedy pass@1 only.")] = 1,
        k: Annotated[Optional[list[int]], typer.Option("--k", min=1, help="pass@k to report when --n > 1 (repeatable; default 1, 5, 10 and n where <= n).")] = None,
        directory: Annotated[Optional[Path], typer.Option("--dir", help="Project directory holding warehouse.duckdb (default: run.dir of --config).")] = None,
        config: Annotated[str, typer.Option("--config", "-c", help="Profile or YAML path for the model when evaluating without --run.")] = "cpu",
        set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override one field: section.field=value (repeatable; with --run, applied to the run's config).")] = None,
) -> None:
    """Evaluate the base model and checkpoints on benchmarks (greedy pass@1, pass@k with --n); print them side by side."""
    from rich.table import Table

    from sage.engines.data.benchmarks import BenchmarkUnavailable
    from sage.flows.progress import StageProgress
    from sage.flows.terminal import BUSY, console, err, fail
    from sage.warehouse import WarehouseBusy

    checkpoints = list(checkpoint or (DEFAULT_CHECKPOINTS if run_id else ("base",)))
    benchmarks = list(benchmark or DEFAULT_BENCHMARKS)
    if k and n == 1:
        fail("--k needs --n > 1 samples per problem (e.g. --n 10 --k 1 --k 5)")
    if k and max(k) > n:
        fail(f"--k {max(k)} needs --n >= {max(k)} samples per problem")
    try:
        cfg = load_config(config, set_ or [])
        for spec in benchmarks:
            evaluate_stage.parse_benchmark(spec)
        directory = str(Path(directory or cfg.run.dir).expanduser())
        with StageProgress(err) as progress, session.Session(directory, progress=progress):
            rows = eval_flow(directory, run_id, checkpoints, benchmarks, limit, n, k, config, set_)
    except WarehouseBusy as e:
        fail(str(e), code=BUSY)
    except (ConfigError, ValueError, BenchmarkUnavailable) as e:
        fail(str(e))
    table = Table(title=f"evaluations{f' of run {run_id}' if run_id else ''} (pass rates, 0-1)")
    lines = side_by_side(rows)
    for name in (lines[0] if lines else ["benchmark"]):
        table.add_column(str(name), overflow="fold")
    for line in lines:
        table.add_row(*["" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)) for v in line.values()])
    console.print(table)
    console.print(f"stored in {session.warehouse_path(directory)}: "
                  f"sage sql \"select * from evaluations order by created_at desc\" --dir {directory}")
