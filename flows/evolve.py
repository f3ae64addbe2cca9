"""`sage run`: seeds if needed, then iterations, each a `sage-iteration` subflow.

Iteration k generates with the adapter iteration k - 1 produced. A run id names a config: running the same
command again resumes the run where it stopped and redoes nothing that is done.
"""

from __future__ import annotations

from prefect import flow

from flows import session
from flows.iteration import iteration_flow
from flows.record import run_recorded
from stages import seed as seed_stage
from warehouse.queries import set_run_status


@flow(name="sage-run", flow_run_name="{run_id}")
def evolve_flow(directory: str, run_id: str, iterations: int) -> list[dict]:
    ctx = session.context(directory, run_id, 0)
    set_run_status(ctx.wh, run_id, "running")
    run_recorded(ctx, "seed", seed_stage.run, run_id=seed_stage.seeds_key(ctx), iteration=0)
    summaries = []
    try:
        for k in range(1, iterations + 1):
            summaries.append(iteration_flow(directory, run_id, k))
    except BaseException:
        set_run_status(ctx.wh, run_id, "failed")
        raise
    set_run_status(ctx.wh, run_id, "done")
    return summaries
