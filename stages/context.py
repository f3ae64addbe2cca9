"""What every stage receives: the config, the warehouse, which run and iteration, the engines, where its
fan-out runs, and where it reports progress.

`StageContext` is what seeding and evaluation receive, with or without a run; `RunContext` is what every stage of
an iteration receives (flows/iteration.py): the same, with its run's id.

Engines (`Engines`) are built on first use and belong to whoever builds the contexts (the flow's session, a
test, a benchmark), so a model loads once per process and a test can hand in a scripted generator. The
fan-out (`stages/fanout.py`) is local unless the flow injects another.
"""
# pyright: basic

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sage.configs.names import Role
from sage.configs.schema import SageConfig
from sage.engines.llm.base import Sleeps
from sage.engines.train import role_adapter_dir
from sage.stages.fanout import Fanout, Local
from sage.warehouse import Warehouse

if TYPE_CHECKING:  # built on first use: a stage that needs no model or sandbox never imports them
    from sage.engines.llm.base import LLM
    from sage.engines.verify.mathcheck import MathChecker
    from sage.engines.verify.sandbox import Sandbox

# progress(stage, done, total, tokens, unit=, note=, metrics=): how a stage reports units done (rows unless `unit`
# says otherwise: training counts optimizer steps), tokens so far, a short `note` (training's last loss) and the
# unit's numbers (`metrics`: training's update record, `train_steps`' columns)
ProgressFn = Callable[..., None]


@dataclass
class StageReport:
    stage: str
    rows_in: int = 0
    rows_out: int = 0
    info: dict[str, Any] = field(default_factory=dict)


def switched_off(stage: str, switch: str) -> StageReport:
    """The report of a stage whose role the config switches off (`switch`, e.g. `iteration.challenger`; an
    ablation): it read and wrote nothing, and its summary line says why."""
    return StageReport(stage, info={"skipped": f"{switch} is false"})


class Engines:
    """The generation backend, sandbox and math checker for one config, each built on first use; `given`
    engines (a scripted generator, timed wrappers) are used as they are. `close()` stops what was built."""

    def __init__(self, cfg: SageConfig, **given: Any):
        self.cfg = cfg
        self._built: dict[str, Any] = dict(given)
        self._given = set(given)

    def _get(self, name: str, build: Callable[[], Any]) -> Any:
        if name not in self._built:
            self._built[name] = build()
        return self._built[name]

    @property
    def sandbox(self) -> Sandbox:
        from sage.engines.verify.sandbox import Sandbox

        return self._get("sandbox", lambda: Sandbox(self.cfg.sandbox))

    @property
    def mathcheck(self) -> MathChecker:
        from sage.engines.verify.mathcheck import MathChecker

        return self._get("mathcheck", lambda: MathChecker(self.cfg.mathcheck))

    @property
    def llm(self) -> LLM:
        from sage.engines.llm import load_llm

        return self._get("llm", lambda: load_llm(self.cfg.model))

    def release(self, name: str) -> None:
        """Close and drop engine `name` when this object built it (a given one stays); the next use builds it
        again."""
        engine = None if name in self._given else self._built.pop(name, None)
        close = getattr(engine, "close", None)
        if close:
            close()

    def suspend(self, name: str) -> None:
        """Give back the device memory engine `name` holds while something else uses the device: the train stage
        suspends the generation model, so training never holds the GPU beside it. A backend that `Sleeps` (vllm)
        sleeps and wakes on its next generate: the same engine, with no reload, re-profile or CUDA-graph capture;
        any other (hf) is released, and built again on next use. Nothing happens to an engine not built yet."""
        engine = self._built.get(name)
        if isinstance(engine, Sleeps):
            engine.sleep()
        else:
            self.release(name)

    def close(self) -> None:
        for engine in self._built.values():
            close = getattr(engine, "close", None)
            if close:
                close()
        self._built.clear()


@dataclass(init=False)
class StageContext:
    cfg: SageConfig
    wh: Warehouse
    run_id: str | None                  # None: seeding, or evaluating a model outside any run
    iteration: int
    adapter: str | None                 # adapter this iteration generates with (None = base model)
    progress: ProgressFn | None
    engines: Engines
    fanout: Fanout

    def __init__(self, cfg: SageConfig, wh: Warehouse, run_id: str | None = None, iteration: int = 0,
                 adapter: str | None = None, progress: ProgressFn | None = None, engines: Engines | None = None,
                 fanout: Fanout | None = None):
        """`engines` None: this context's own (closed by `close`); `fanout` None: in this process, with them."""
        self.cfg, self.wh, self.run_id, self.iteration = cfg, wh, run_id, iteration
        self.adapter, self.progress = adapter, progress
        self.engines = engines if engines is not None else Engines(cfg)
        self.fanout = fanout if fanout is not None else Local(self.engines)

    def report(self, stage: str, done: int, total: int, tokens: int = 0, *, unit: str = "rows",
               note: str = "", metrics: dict | None = None) -> None:
        if self.progress:
            self.progress(stage, done, total, tokens, unit=unit, note=note, metrics=metrics)

    @property
    def sandbox(self) -> Sandbox:
        return self.engines.sandbox

    @property
    def mathcheck(self) -> MathChecker:
        return self.engines.mathcheck

    @property
    def llm(self) -> LLM:
        """The generation backend, switched to the Solver's adapter (this context's, `adapter`)."""
        return self.llm_for(Role.SOLVER)

    def llm_for(self, role: Role) -> LLM:
        """The generation backend, switched to the adapter `role` generates with (`adapter_for`)."""
        llm, adapter = self.engines.llm, self.adapter_for(role)
        if llm.adapter != adapter:
            llm.use_adapter(adapter)
        return llm

    def adapter_for(self, role: Role) -> str | None:
        """The adapter `role` generates with (None: the base model). `train.adapters` shared: this context's,
        every role's. per_role: the Solver's is this context's, another role's is its own beside it
        (`role_adapter_dir`), or the base model while that role has none (it was never trained)."""
        if self.adapter is None or self.cfg.train.adapters == "shared" or role == Role.SOLVER:
            return self.adapter
        own = role_adapter_dir(self.adapter, role)
        return str(own) if (own / "adapter_config.json").is_file() else None

    def close(self) -> None:
        """Stop the engines (pools, workers, model); for contexts that own them (tests, one-off commands)."""
        self.engines.close()


@dataclass(init=False)
class RunContext(StageContext):
    """The context of one iteration of a run: every stage of `ITERATION_STAGES` and validation receive one."""
    run_id: str  # narrowed: a run's stages always have it

    def __init__(self, cfg: SageConfig, wh: Warehouse, run_id: str, iteration: int = 0, adapter: str | None = None,
                 progress: ProgressFn | None = None, engines: Engines | None = None, fanout: Fanout | None = None):
        super().__init__(cfg, wh, run_id, iteration, adapter, progress, engines, fanout)
