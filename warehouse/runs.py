"""A run's identity and its stored config: recording a run, finding it again, and loading the config every
stage of it runs with (one loader for the flows, `sage eval` and `sage export`)."""
# pyright: basic

from __future__ import annotations

import hashlib
import json
import re
import socket

from sage.configs import apply_override, config_from_dict, config_hash, config_json, identity_diff
from sage.configs.names import Stage
from sage.configs.schema import SageConfig
from sage.warehouse import locks
from sage.warehouse.checkpoints import check_retained
from sage.warehouse.db import Warehouse
from sage.warehouse.queries import (
    iteration_stage_states,
    iteration_states,
    run_config,
    run_ids,
    running_owners,
    set_run_config,
    stage_status,
)
from sage.warehouse.redo import ORDER


class RunNotFound(ValueError):
    """No run of that id in the warehouse."""


class RunConfigMismatch(ValueError):
    """A run id that exists with another config."""


class IterationNotFound(ValueError):
    """A stage asked for an iteration the run does not have and cannot start yet."""


class StageInputsMissing(IterationNotFound):
    """A stage asked for an iteration whose earlier stages (what it reads) are not done yet."""


def create_run(wh: Warehouse, cfg: SageConfig, run_id: str | None = None) -> str:
    """Record a run (or find it again). The default id is the hash of the config's identity (configs/identity.py),
    so `sage run` with the same config resumes the same run, also with more iterations or another placement;
    an existing id whose identity fields differ is an error that lists them."""
    h = config_hash(cfg)
    run_id = run_id or f"run-{h[:8]}"
    existing = run_config(wh, run_id)
    if existing is None:
        wh.insert_batch("runs", [dict(run_id=run_id, config=config_json(cfg), config_hash=h,
                                      base_model=cfg.model.name, seed=cfg.run.seed)])
        return run_id
    stored = _stored_config(existing[0])
    diff = identity_diff(stored, cfg)
    if diff:
        raise RunConfigMismatch(
            f"run {run_id!r} exists with a config that decides other rows:\n  " + "\n  ".join(diff) +
            "\nto keep the stored run, drop the --set overrides that changed these; to start a new run with "
            "this config, name it: --run NAME (a name not in `sage status`)")
    if existing[0] != config_json(cfg) or existing[1] != h:
        # same rows, other schedule or placement (more iterations, Ray, another batch size): later stages use it
        set_run_config(wh, run_id, config_json(cfg), h)
    return run_id


def dead_rows(wh: Warehouse) -> dict[tuple[str, int | None, str | None], tuple[int | None, str | None]]:
    """The runs, iterations and stages recorded `running` whose owner process is gone (killed outright, or its
    machine restarted), keyed as `running_owners`: only the warehouse's writer sets rows running, so a row is
    alive while its owner still holds the writer lock (a row older than the owner columns: while anyone does).
    A row owned on another host is taken as alive: its process cannot be checked from here. Reads only."""
    holder, host = locks.writer_pid(wh.path), socket.gethostname()

    def alive(pid: int | None, on: str | None) -> bool:
        if on is not None and on != host:
            return True
        return holder is not None if pid is None else pid == holder

    return {key: who for key, who in running_owners(wh).items() if not alive(*who)}


def _stored_config(text: str) -> SageConfig | dict:
    data = json.loads(text)
    try:
        return config_from_dict(data)  # defaults filled in, as a new config has them
    except ValueError:
        return data


def load_run_config(wh: Warehouse, run_id: str, overrides: list[str] | tuple[str, ...] = ()) -> SageConfig:
    """The config run `run_id` was recorded with, plus `overrides` (`section.field=value`, e.g. to evaluate
    its checkpoints on another backend)."""
    stored = run_config(wh, run_id)
    if stored is None:
        raise RunNotFound(f"no run {run_id!r} in {wh.path}; `sage status` lists the runs")
    data = json.loads(stored[0])
    for assignment in overrides:
        apply_override(data, assignment)
    return config_from_dict(data, source=f"run {run_id}")


def run_dirname(run_id: str) -> str:
    """A directory name for a run (adapters, reports, exports): the run id when it is a plain name, else its
    letters, digits, `.`, `_` and `-` plus a short hash of the id, so `exp.1/a b:c` neither nests nor escapes
    a directory and two names never share one."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id).strip(".-")
    if name == run_id:
        return name
    return f"{name or 'run'}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def check_stage_target(wh: Warehouse, run_id: str, iteration: int, stage: str, force: bool = False) -> None:
    """Refuse, before anything is written, a stage on a run or an iteration that does not exist, whose inputs
    are not done (`check_stage_inputs`), or that would run (`force`, or not done) and read an adapter or optimizer
    state checkpoint retention deleted (`checkpoints.check_retained`). A stage may run on an iteration the run has,
    on the next one (last + 1) once the last is done, and `validate` also on iteration 0 (the base model)."""
    if run_config(wh, run_id) is None:
        names = run_ids(wh)
        have = f"runs here: {', '.join(names)}" if names else "no runs yet (start one with `sage run`)"
        raise RunNotFound(f"no run {run_id!r} in {wh.path}; {have}")
    states = iteration_states(wh, run_id)
    last = max(states, default=0)
    starts_next = (iteration == last + 1 and iteration > 0 and stage != Stage.VALIDATE
                   and states.get(last, "done") == "done")
    if iteration in states or (iteration == 0 and stage == Stage.VALIDATE) or starts_next:
        check_stage_inputs(wh, run_id, iteration, stage)
        if force or stage_status(wh, run_id, iteration, stage) != "done":
            check_retained(wh, run_id, iteration, stage)
        return
    have = (f"it has iterations {', '.join(f'{k} ({v})' for k, v in sorted(states.items()))}" if states
            else "it has no iterations yet")
    nxt = (f"iteration {last + 1} can start once iteration {last} is done" if states.get(last, "done") != "done"
           else f"a stage other than validate may start the next one, {last + 1}")
    raise IterationNotFound(f"run {run_id!r} has no iteration {iteration}: {have}; {nxt}; validate also takes "
                            f"iteration 0 (the base model)")


def stage_inputs(stage: str, iteration: int) -> list[str]:
    """The stages whose rows `stage` reads in its iteration: every stage before it (the data flow is a chain, and
    scoring reads nearly all of them); validation of iteration k reads its adapter, so all of them; validation of
    iteration 0 (the base model) and the seed stage read none."""
    if stage not in ORDER or (stage == Stage.VALIDATE and iteration == 0):
        return []
    return [str(s) for s in ORDER[:ORDER.index(Stage(stage))]]


def check_stage_inputs(wh: Warehouse, run_id: str, iteration: int, stage: str) -> None:
    """Refuse, before anything is written, a stage whose inputs are not `done` for the iteration: run on missing
    rows it would find nothing (verify: no answers) and be recorded done, and the next `sage run` would skip it.
    The error names the stages not done and the command that produces the first of them."""
    states = iteration_stage_states(wh, run_id, iteration)
    missing = [s for s in stage_inputs(stage, iteration) if states.get(s) != "done"]
    if not missing:
        return
    listed = ", ".join(f"{s} ({states.get(s) or 'never run'})" for s in missing)
    raise StageInputsMissing(
        f"stage {stage} of run {run_id!r} iteration {iteration} reads what earlier stages write, and these are not "
        f"done: {listed}; nothing was written. Produce them first: `sage run` with the run's config (--run "
        f"{run_id}) does every missing stage in order, or `sage stage {missing[0]} --run {run_id} --iteration "
        f"{iteration}` runs the first")
