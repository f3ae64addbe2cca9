"""`sage eval`: the base model and checkpoints of a run on benchmarks, as a Prefect flow, side by side.

One task per benchmark: its problems load once (code references run in the sandbox), then each checkpoint
is evaluated on them. Every checkpoint name resolves before anything generates. Rows land in `evaluations` (see
stages/evaluate.py for the id and what is stored); asking again for a stored evaluation generates nothing and
shows the stored numbers. Without a run, the base model of `--config/--set` is evaluated (rows with run_id NULL).
The command that starts it is in `eval_command.py`, which the CLI loads without Prefect.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import flow, task
from prefect.cache_policies import NONE

from sage.configs import load_config
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
def evaluate_task(directory: str, run_id: str | None, benchmark: str, checkpoints: Sequence[str], limit: int | None,
                  n: int, ks: list[int], config: str, overrides: list[str] | None) -> list[tuple[str, str]]:
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
def eval_flow(directory: str, run_id: str | None = None, checkpoints: Sequence[str] = DEFAULT_CHECKPOINTS,
              benchmarks: Sequence[str] = DEFAULT_BENCHMARKS, limit: int | None = None, n: int = 1,
              k: list[int] | None = None, config: str = "cpu", overrides: list[str] | None = None) -> list[dict]:
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
