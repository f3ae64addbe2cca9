"""What every stage receives: the config, the warehouse, which run and iteration, and lazily built engines.

Engines are created on first use and kept for the life of the flow process, so a model loads once per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from configs.schema import SageConfig
from warehouse import Warehouse

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

    def report(self, stage: str, done: int, total: int, tokens: int = 0) -> None:
        if self.progress:
            self.progress(stage, done, total, tokens)

    @property
    def sandbox(self):
        if "sandbox" not in self._engines:
            from engines.sandbox import Sandbox

            self._engines["sandbox"] = Sandbox(self.cfg.sandbox)
        return self._engines["sandbox"]

    @property
    def mathcheck(self):
        if "mathcheck" not in self._engines:
            from engines.mathcheck import MathChecker

            self._engines["mathcheck"] = MathChecker(self.cfg.mathcheck)
        return self._engines["mathcheck"]

    @property
    def llm(self):
        """The generation backend, switched to this iteration's adapter."""
        if "llm" not in self._engines:
            from engines.llm import load_llm

            self._engines["llm"] = load_llm(self.cfg.model)
        llm = self._engines["llm"]
        if llm.adapter != self.adapter:
            llm.use_adapter(self.adapter)
        return llm

    def set_engine(self, name: str, engine: Any) -> None:
        """Install an engine explicitly (tests use a scripted generator this way)."""
        self._engines[name] = engine

    def close(self) -> None:
        for engine in self._engines.values():
            close = getattr(engine, "close", None)
            if close:
                close()
        self._engines.clear()
