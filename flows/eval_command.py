"""`sage eval`, the command: checks its options, runs the `sage-eval` flow (`evaluate.py`) and prints the
checkpoints side by side. Kept apart from the flow so the CLI loads without Prefect; a failure the user can
act on (bad config, busy warehouse, missing benchmark) ends through the command group's one error path."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


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
        run_id: Annotated[str | None, typer.Option("--run", help="Run whose checkpoints to evaluate (see `sage "
                                                   "status`); without it only the base model of --config.")] = None,
        checkpoint: Annotated[list[str] | None, typer.Option("--checkpoint", help="base, best, latest or an iteration "
                                                             "number (repeatable; default: base and best, or base "
                                                             "without --run).")] = None,
        benchmark: Annotated[list[str] | None, typer.Option("--benchmark", "-b", help="humaneval, math500, aime, "
                                                            "gsm8k, mbppplus, olympiadbench, livecodebench; a hub set "
                                                            "may name a local file: gsm8k=test.jsonl (repeatable; "
                                                            "default: humaneval and math500).")] = None,
        limit: Annotated[int | None, typer.Option("--limit", help="Evaluate only the first N problems of each "
                                                  "benchmark.")] = None,
        n: Annotated[int, typer.Option("--n", min=1, help="Samples per problem for pass@k (at roles.solver "
                                       "temperature); 1 = greedy pass@1 only.")] = 1,
        k: Annotated[list[int] | None, typer.Option("--k", min=1, help="pass@k to report when --n > 1 "
                                                    "(repeatable; default 1, 5, 10 and n where <= n).")] = None,
        directory: Annotated[Path | None, typer.Option("--dir", help="Project directory holding warehouse.duckdb "
                                                       "(default: run.dir of --config).")] = None,
        config: Annotated[str, typer.Option("--config", "-c", help="Profile or YAML path for the model when "
                                            "evaluating without --run.")] = "cpu",
        set_: Annotated[list[str] | None, typer.Option("--set", help="Override one field: section.field=value "
                                                       "(repeatable; with --run, applied to the run's config).")]
        = None,
) -> None:
    """
    Evaluate the base model and checkpoints on benchmarks (greedy pass@1, pass@k with --n); print them side by side.
    """
    from rich.table import Table

    from sage.configs import load_config
    from sage.flows import session
    from sage.flows.evaluate import DEFAULT_BENCHMARKS, DEFAULT_CHECKPOINTS, eval_flow
    from sage.flows.progress import Display
    from sage.flows.terminal import console, err, fail
    from sage.stages import evaluate as evaluate_stage

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
        with Display(err) as display, session.Session(directory, display=display):
            rows = eval_flow(directory, run_id, checkpoints, benchmarks, limit, n, k, config, set_)
    except ValueError as e:  # a benchmark spec or value the stage refuses
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
