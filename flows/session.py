"""The session a `sage` process works in: one project directory's warehouse (this process is its one writer for
the session, holding the file only while it commits, so readers get in between), the engines of each run (a model
loads once per process), the Ray fan-out when a run asks for it, and the live display (`flows/progress.py`) its
stages report to.

Flows and their tasks take plain parameters (directory, run id, iteration, stage name), as Prefect's own
examples do, so deployments and the UI can start them and nothing unpicklable travels with a task to Ray.
Whoever calls a flow may open a session and make it current (`with Session(dir, ...) as s:`): the CLI does,
to show progress (`display=`); tests do, to hand in a scripted generator (`engines={"llm": ...}`); a benchmark does, to
time the engines. A flow started without one (a deployment) opens its own (`opened`) and closes it when it
ends. The flow's tasks find the session through `opened` too: the current session is a context variable,
set only inside that `with` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from pathlib import Path
from typing import Any, overload

from sage.configs.schema import SageConfig
from sage.flows.artifacts import LiveArtifacts
from sage.flows.progress import QUIET, Display
from sage.flows.record import handle_signals, stop_if_interrupted
from sage.stages.context import Engines, RunContext, StageContext
from sage.warehouse import Warehouse, warehouse_path
from sage.warehouse.queries import iteration_adapter
from sage.warehouse.runs import create_run, load_run_config

_CURRENT: ContextVar[Session | None] = ContextVar("sage_session", default=None)


class Session:
    """What the flows of one project directory share in this process; `close()` releases all of it."""

    def __init__(self, directory: str | Path, *, display: Display | None = None,
                 engines: dict[str, Any] | None = None, ray: Any = None):
        self.directory = Path(directory).expanduser().resolve()
        self.display = display or Display(mode=QUIET)  # shows nothing: a deployment, a test
        self.live = LiveArtifacts()                     # stage progress in the Prefect UI, inside a flow run
        self.given = dict(engines or {})      # engines used as they are, for every run (scripted, timed)
        self._warehouse: Warehouse | None = None
        self._engines: dict[str, Engines] = {}
        self._configs: dict[str, SageConfig] = {}  # each run's stored config, read and validated once
        self.ray, self._own_ray = ray, ray is None  # the Ray fan-out (flows/fanout.py), once a run asks for it
        self.flow_runs: set[str] = set()  # ids of the Prefect flow runs that worked in this session
        self._token = None

    # -- the warehouse and runs

    @property
    def warehouse(self) -> Warehouse:
        if self._warehouse is None:
            self._warehouse = Warehouse.open(warehouse_path(self.directory))
        return self._warehouse

    def create_run(self, cfg: SageConfig, run_id: str | None = None) -> str:
        run_id = create_run(self.warehouse, cfg, run_id)
        self._configs.pop(run_id, None)  # its stored schedule or placement may have changed
        return run_id

    def run_config(self, run_id: str, overrides: list[str] | tuple[str, ...] = ()) -> SageConfig:
        """The run's stored config (plus `overrides`). Without overrides it is read and validated once per
        session: every stage context of every iteration uses it, and only `create_run` changes it."""
        if overrides:
            return load_run_config(self.warehouse, run_id, overrides)
        if run_id not in self._configs:
            self._configs[run_id] = load_run_config(self.warehouse, run_id)
        return self._configs[run_id]

    # -- contexts for stages

    def context(self, run_id: str, iteration: int) -> RunContext:
        """A stage context for (run, iteration): the run's stored config, the adapter the iteration generates
        with (the one iteration k - 1 produced), this session's engines and fan-out."""
        cfg = self.run_config(run_id)
        adapter = iteration_adapter(self.warehouse, run_id, iteration - 1) if iteration > 1 else None
        return self.context_for(cfg, run_id, iteration, adapter)

    @overload
    def context_for(self, cfg: SageConfig, run_id: str, iteration: int = 0,
                    adapter: str | None = None) -> RunContext: ...

    @overload
    def context_for(self, cfg: SageConfig, run_id: None, iteration: int = 0,
                    adapter: str | None = None) -> StageContext: ...

    def context_for(self, cfg: SageConfig, run_id: str | None, iteration: int = 0,
                    adapter: str | None = None) -> StageContext:
        """A stage context for a config that need not be a stored run's (seeding, evaluating a base model): a
        `RunContext` when it names a run."""
        key = run_id or f"model:{cfg.model.name}"
        if key not in self._engines:
            self._engines[key] = Engines(cfg, **self.given)
        engines = self._engines[key]
        progress, fanout = partial(self._report, run_id, iteration), self._fanout(cfg, engines)
        if run_id is None:
            return StageContext(cfg, self.warehouse, None, iteration, adapter, progress, engines, fanout)
        return RunContext(cfg, self.warehouse, run_id, iteration, adapter, progress, engines, fanout)

    def _report(self, run_id: str | None, iteration: int, stage: str, done: int, total: int, tokens: int = 0, *,
                unit: str = "rows", note: str = "", metrics: dict | None = None) -> None:
        """A stage's progress goes to the display and the Prefect UI (`LiveArtifacts`); a signal whose exception
        was swallowed stops it here."""
        stop_if_interrupted()
        self.display.report(iteration, stage, done, total, tokens, unit=unit, note=note, metrics=metrics)
        if run_id is not None:
            self.live.report(run_id, iteration, stage, done, total, unit=unit, metrics=metrics)

    def _fanout(self, cfg: SageConfig, engines: Engines):
        if cfg.orchestration.runner == "local":
            return None  # the context's default: in this process, with its engines
        from sage.flows.fanout import Ray, RaySession

        if self.ray is None:
            self.ray = RaySession(cfg.orchestration)
        return Ray(self.ray, cfg)

    # -- lifetime

    def close(self) -> None:
        for engines in self._engines.values():
            engines.close()
        self._engines.clear()
        if self.ray is not None and self._own_ray:
            self.ray.close()
            self.ray = None
        if self._warehouse is not None:
            self._warehouse.close()
            self._warehouse = None

    def __enter__(self) -> Session:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._token)
        self.close()


@contextmanager
def opened(directory: str | Path) -> Iterator[Session]:
    """The current session when the caller opened one for `directory`, else a new one for the time of the
    `with` block (a flow started by a deployment, a task run on its own)."""
    handle_signals()  # inside a flow run, where Prefect's engine has put its own SIGTERM handler
    current = _CURRENT.get()
    if current is not None and current.directory == Path(directory).expanduser().resolve():
        from prefect.runtime import flow_run

        if flow_run.id:  # the flow runs of this session: an interrupted command marks them Cancelled
            current.flow_runs.add(flow_run.id)
        yield current
        return
    with Session(directory) as session:
        yield session
