"""`sage eval`, the command: checks its options, runs the `sage-eval` flow (`evaluate.py`) and prints the
checkpoints side by side. Kept apart from the flow so the CLI loads without Prefect; a failure the user can
act on (bad config, busy warehouse, missing benchmark) ends through the command group's one error path."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

HUB_TIMEOUT_S = 3.0
_TRUE = ("1", "ON", "YES", "TRUE")
HUB_DATASETS = {"livecodebench": "livecodebench/code_generation_lite"}  # loaded through the `json` builder


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


def _offline() -> bool:
    return any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                                 "TRANSFORMERS_OFFLINE"))


def _hub_reachable(timeout_s: float = HUB_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub (HF_ENDPOINT) answers at all within `timeout_s`."""
    import httpx

    try:
        httpx.head(os.environ.get("HF_ENDPOINT") or "https://huggingface.co", timeout=timeout_s)
    except (httpx.HTTPError, ValueError):
        return False
    return True


def _go_offline() -> None:
    """Hugging Face reads from its caches only, for this process and those it starts: no request retried for
    most of a minute before it fails. The libraries read the setting when imported, so imported ones are set too."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    if "huggingface_hub.constants" in sys.modules:
        sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = True
    if "datasets.config" in sys.modules:
        config = sys.modules["datasets.config"]
        config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = True


def check_hub_benchmarks(specs: Sequence[str]) -> None:
    """Before anything starts: where the hub cannot be reached (or HF_HUB_OFFLINE is set), each hub benchmark
    asked for without a local file must be in the Hugging Face cache; one that is not raises BenchmarkUnavailable
    with one sentence saying how to pass it as a file. Offline, the datasets load from the cache only."""
    from sage.engines.data.benchmarks import HUB, BenchmarkUnavailable, load_benchmark
    from sage.stages.evaluate import parse_benchmark

    hub = [name for name, path in map(parse_benchmark, specs) if name in HUB and path is None]
    if not hub:
        return
    if _offline():
        why = "offline mode is set (HF_HUB_OFFLINE)"
    elif _hub_reachable():
        return
    else:
        why = f"{os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'} cannot be reached"
    _go_offline()
    for name in dict.fromkeys(hub):
        try:
            load_benchmark(name, limit=1)
        except BenchmarkUnavailable:
            dataset = HUB_DATASETS.get(name) or HUB[name][1][0]
            raise BenchmarkUnavailable(
                f"benchmark {name} is not available offline ({why}, and it is not in the Hugging Face cache): "
                f"download {dataset} where the hub is reachable and pass it as a file, e.g. -b {name}=test.jsonl "
                f"(JSONL or Parquet with the dataset's own fields: {', '.join(HUB[name][3])}, ...)") from None


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
    from sage.flows.api_server import check_api, prefect_api
    from sage.flows.evaluate import DEFAULT_BENCHMARKS, DEFAULT_CHECKPOINTS, eval_flow
    from sage.flows.progress import Display
    from sage.flows.terminal import console, err, fail, quiet_prefect_tracebacks
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
        check_api()  # a configured Prefect server that is down: PrefectUnreachable, before any work
        check_hub_benchmarks(benchmarks)
        directory = str(Path(directory or cfg.run.dir).expanduser())
        say = lambda line: err.print(line, highlight=False, markup=False, soft_wrap=True)  # noqa: E731
        with prefect_api(say), Display(err) as display, session.Session(directory, display=display):
            quiet_prefect_tracebacks()
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
