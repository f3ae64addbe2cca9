"""What every stage receives: the config, the warehouse, which run and iteration, and lazily built engines.

Engines are created on first use and kept for the life of the flow process, so a model loads once per run.
`fanout` says where a stage's parallel work (verification, scoring) runs: here, or on Ray (stages/fanout.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from sage.configs.schema import SageConfig
from sage.warehouse import Warehouse

# progress(stage, done, total, tokens): how a stage reports rows done and tokens generated so far
ProgressFn = Callable[[str, int, int, int], None]


@dataclass
class StageReport:
    stage: str
    rows_in: int = 0
    rows_out: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageContext:
    cfg: SageConfig
    wh: Warehouse
    run_id: str | None = None
    iteration: int = 0
    adapter: str | None = None          # adapter this iteration generates with (None = base model)
    progress: ProgressFn | None = None
    _engines: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.cfg.orchestration.runner == "ray":
            from sage.stages.fanout import require_ray

            require_ray()

    def report(self, stage: str, done: int, total: int, tokens: int = 0) -> None:
        if self.progress:
            self.progress(stage, done, total, tokens)

    @property
    def sandbox(self):
        if "sandbox" not in self._engines:
            from sage.engines.verify.sandbox import Sandbox

            self._engines["sandbox"] = Sandbox(self.cfg.sandbox)
        return self._engines["sandbox"]

    @property
    def mathcheck(self):
        if "mathcheck" not in self._engines:
            from sage.engines.verify.mathcheck import MathChecker

            self._engines["mathcheck"] = MathChecker(self.cfg.mathcheck)
        return self._engines["mathcheck"]

    @property
    def llm(self):
        """The generation backend, switched to this iteration's adapter."""
        if "llm" not in self._engines:
            from sage.engines.llm import load_llm

            self._engines["llm"] = load_llm(self.cfg.model)
        llm = self._engines["llm"]
        if llm.adapter != self.adapter:
            llm.use_adapter(self.adapter)
        return llm

    @property
    def fanout(self):
        """`fanout.map(fn, rows, batch)`: in this process, or as Prefect tasks on the Ray instance this
        context started or joined (kept with the engines, stopped by `close`)."""
        from sage.stages import fanout

        if self.cfg.orchestration.runner == "local":
            return fanout.Local(self)
        if "ray" not in self._engines:
            self._engines["ray"] = fanout.RaySession(self.cfg.orchestration)
        return fanout.Ray(self._engines["ray"], self.cfg)

    def set_engine(self, name: str, engine: Any) -> None:
        """Install an engine explicitly (tests use a scripted generator this way)."""
        self._engines[name] = engine

    def close(self) -> None:
        for engine in self._engines.values():
            close = getattr(engine, "close", None)
            if close:
                close()
        self._engines.clear()
