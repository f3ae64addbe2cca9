"""One process-wide session per project directory: the warehouse connection (DuckDB allows one writer, the
flow process) and the engines (a model loads once per process), shared by every flow and stage run here."""

from __future__ import annotations

import json
from pathlib import Path

from sage.configs import config_from_dict, config_hash, config_json
from sage.configs.schema import SageConfig
from sage.stages.context import ProgressFn, StageContext
from sage.warehouse import Warehouse
from sage.warehouse.queries import iteration_adapter, run_config, set_run_config

_WAREHOUSES: dict[str, Warehouse] = {}
_ENGINES: dict[str, dict] = {}


def warehouse_path(directory: str | Path) -> Path:
    return Path(directory).expanduser() / "warehouse.duckdb"


def warehouse(directory: str | Path) -> Warehouse:
    path = str(warehouse_path(directory).resolve())
    if path not in _WAREHOUSES:
        _WAREHOUSES[path] = Warehouse.open(path)
    return _WAREHOUSES[path]


class RunConfigMismatch(ValueError):
    pass


def create_run(cfg: SageConfig, run_id: str | None = None) -> str:
    """Record a run (or find it again). The default id is the config's hash, so `sage run` with the same
    config resumes the same run; an existing id with a different config is an error."""
    wh = warehouse(cfg.run.dir)
    h = config_hash(cfg)
    run_id = run_id or f"run-{h[:8]}"
    existing = run_config(wh, run_id)
    if existing is None:
        wh.insert_batch("runs", [dict(run_id=run_id, config=config_json(cfg), config_hash=h,
                                      base_model=cfg.model.name, seed=cfg.run.seed)])
    elif existing[1] != h:
        raise RunConfigMismatch(f"run {run_id!r} exists with a different config (hash {existing[1]} != {h}); "
                                f"pick a new name with --run, or drop the --set overrides that changed")
    elif existing[0] != config_json(cfg):
        # same run, launched with other placement (e.g. orchestration.runner=ray): later stages use it
        set_run_config(wh, run_id, config_json(cfg))
    return run_id


def context(directory: str | Path, run_id: str, iteration: int, progress: ProgressFn | None = None) -> StageContext:
    """A stage context for (run, iteration), with the run's stored config and this process's engines."""
    wh = warehouse(directory)
    stored = run_config(wh, run_id)
    if stored is None:
        raise KeyError(f"no run {run_id!r} in {wh.path}; `sage status` lists the runs")
    cfg = config_from_dict(json.loads(stored[0]), source=f"run {run_id}")
    engines = _ENGINES.setdefault(run_id, {})
    adapter = iteration_adapter(wh, run_id, iteration - 1) if iteration > 1 else None
    return StageContext(cfg=cfg, wh=wh, run_id=run_id, iteration=iteration, adapter=adapter,
                        progress=progress, _engines=engines)


def close_all() -> None:
    for engines in _ENGINES.values():
        for engine in engines.values():
            getattr(engine, "close", lambda: None)()
    _ENGINES.clear()
    for wh in _WAREHOUSES.values():
        wh.close()
    _WAREHOUSES.clear()
