"""The Prefect artifacts the flows publish: their keys (iteration tables, the validation curve, the run report)
and the live ones that follow a stage while it runs (`LiveArtifacts`)."""

from __future__ import annotations

import logging
import re
import threading
import time

from sage.warehouse.queries import TRAIN_STEP_COLUMNS


def artifact_key(*parts: object) -> str:
    """Prefect artifact keys allow only lowercase letters, digits and dashes; any run name maps onto them."""
    text = "-".join(str(p) for p in parts).lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text)).strip("-")



class LiveArtifacts:
    """Stage progress in the Prefect UI while the stage runs, where the terminal's bars are not seen (a
    deployment, a remote worker): one progress artifact per (run, iteration, stage), `<run>-iteration-<k>-<stage>-
    progress`, updated in place (at most every `every` seconds for rows; at every optimizer update for training,
    whose description then carries the update's loss and grad norm), and when training ends the table of its
    updates (`<run>-iteration-<k>-train-steps`: loss, grad norm, entropy, clip fraction, learning rate, tokens,
    seconds). A table artifact cannot be updated in place, only published again as a new version, which the run
    page would list once per version: so it is published once. Only inside a Prefect flow or task run and from
    the thread that runs it; an API that fails is said once and then left alone: the stage never waits on the UI."""

    def __init__(self, every: float = 2.0):
        self.every = every
        self._progress: dict[tuple[str, int, str], list] = {}   # key -> [artifact id, last update (monotonic)]
        self._steps: dict[tuple[str, int], list[dict]] = {}
        self._broken = False

    def report(self, run_id: str, iteration: int, stage: str, done: int, total: int, *, unit: str = "rows",
               metrics: dict | None = None) -> None:
        if self._broken or threading.current_thread() is not threading.main_thread() or not _in_prefect_run():
            return
        from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact

        percent = round(100.0 * min(done, total) / max(total, 1), 1)
        description = f"{stage}, iteration {iteration} of run {run_id}: {done}/{total} {unit}"
        if metrics is not None:
            shown = {name: metrics.get(name) for name in ("loss", "grad_norm")}
            description += "".join(f", {name.replace('_', ' ')} {value:.4g}" for name, value in shown.items()
                                   if isinstance(value, (int, float)))
        key, now = (run_id, iteration, stage), time.monotonic()
        try:
            held = self._progress.get(key)
            if held is None:
                artifact = create_progress_artifact(percent, key=artifact_key(run_id, "iteration", iteration, stage,
                                                                               "progress"), description=description)
                self._progress[key] = [artifact, now]
            elif unit == "steps" or now - held[1] >= self.every or done >= total:
                update_progress_artifact(held[0], percent, description=description)
                held[1] = now
            if stage == "train" and metrics is not None:
                steps = self._steps.setdefault((run_id, iteration), [])
                steps[:] = [s for s in steps if s["step"] < metrics.get("step", 0)]   # a retried pass starts over
                steps.append({c: _readable(metrics.get(c)) for c in TRAIN_STEP_COLUMNS  # role: one adapter a role
                              if c != "role" or metrics.get("role")})
                if done >= total:
                    create_table_artifact(steps, key=artifact_key(run_id, "iteration", iteration, "train-steps"),
                                          description=f"the {len(steps)} optimizer updates of iteration {iteration} "
                                                      f"of run {run_id}")
        except Exception as e:  # the UI is a view: a server that is down or slow must not fail the stage
            self._broken = True
            logging.getLogger(__name__).warning("stopped updating the Prefect UI's live progress: %s: %s",
                                                type(e).__name__, e)


def _readable(value):
    """A float to 4 significant digits (a loss of 0.24865376949310303 reads 0.2487); anything else as it is."""
    return float(f"{value:.4g}") if isinstance(value, float) else value


def _in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return TaskRunContext.get() is not None or FlowRunContext.get() is not None
