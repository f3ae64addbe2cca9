"""Where an iteration's wall time goes: model calls and the sandbox versus everything else.

    .venv/bin/python -m bench.iteration [--model tiny|smollm2] [--iterations N] [--validate N]
                                        [--set section.field=value ...]

Runs full iterations of `cpu.yaml` (its seed set; validation on `--validate` problems in the config's math/code
proportions) through the real flow, timing each engine call (generation, loading adapters, code sandbox, math
checks, the train stage) with a thin proxy. "Glue" is the rest: Prefect, DuckDB, parsing, Python. Prints, per
iteration, the split and the glue share of wall time (goal: 5% or less with SmolLM2), and each stage's peak resident
memory (this process and its children, sampled every 0.2 s). Iteration 1 generates with the base model, every later
one with the adapter the one before trained (`--iterations 2` times both).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path


class Timed:
    """Delegates to an engine, adding the seconds spent in the named methods to `totals[label]`."""

    def __init__(self, engine, label: str, methods: tuple[str, ...], totals: dict[str, float]):
        self._engine, self._label, self._methods, self._totals = engine, label, methods, totals

    def __getattr__(self, name):
        attr = getattr(self._engine, name)
        if name not in self._methods:
            return attr

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._totals[self._label] = self._totals.get(self._label, 0.0) + time.perf_counter() - start
        return timed


class PeakMemory:
    """Samples the resident memory of this process and its children every `every` seconds and keeps the peak
    per stage (the stage `current` names: set by `stage_namer`), of this process alone (`own`: what
    GNU time's maximum RSS reports for `sage run`) and with its children (`peaks`: forked workers' shared pages
    count twice)."""

    def __init__(self, every: float = 0.2):
        import psutil

        self.current, self.peaks, self.own, self._stop = "setup", {}, {}, threading.Event()
        self._me, self._every = psutil.Process(), every
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(self._every):
            rss = own = self._me.memory_info().rss
            for p in self._me.children(recursive=True):
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peaks[self.current] = max(self.peaks.get(self.current, 0), rss)
            self.own[self.current] = max(self.own.get(self.current, 0), own)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def stage_namer(memory: PeakMemory):
    """A quiet display that names the running stage for `memory`: the flows wrap every stage in the session
    display's `stage(iteration, name)`."""
    from contextlib import contextmanager

    from sage.flows.progress import QUIET, Display

    class StageNamer(Display):
        @contextmanager
        def stage(self, iteration: int, name: str):
            memory.current = str(name)
            try:
                with super().stage(iteration, name) as shown:
                    yield shown
            finally:
                memory.current = "between stages"

    return StageNamer(mode=QUIET)


def _warm_up_prefect() -> None:
    from prefect import flow

    @flow(name="bench-warm-up")
    def noop() -> None:
        return None

    noop()


def validation_overrides(cfg, n: int) -> list[str]:
    """Validation on `n` problems split between math and code as the config splits its own set: the iteration's
    work is timed, not the size of its held-out set (`cpu.yaml` validates 300 problems, about a minute more with
    SmolLM2; `validate.n_math=...` on the command line puts them back). The seed set stays the config's, so the
    Challenger, Planner and Solver see the math/code mix a `sage run` of it sees."""
    v = cfg.validate
    total = v.n_math + v.n_code
    n_math = round(n * v.n_math / total) if total else 0
    return [f"validate.n_math={n_math}", f"validate.n_code={(n - n_math) if total else 0}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--iterations", type=int, default=1, help="iterations to run and time, one after another")
    ap.add_argument("--validate", type=int, default=8, metavar="N",
                    help="validate on N problems, in the config's math/code proportions (default 8)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    import sage.engines.llm as llm_package
    from sage.configs import load_config
    from sage.engines.llm import load_llm
    from sage.engines.llm.tiny import build_tiny_model
    from sage.engines.verify.mathcheck import MathChecker
    from sage.engines.verify.sandbox import Sandbox
    from sage.flows.evolve import evolve_flow
    from sage.flows.record import run_recorded
    from sage.flows.session import Session
    from sage.stages import seed as seed_stage
    from sage.warehouse.queries import stage_states

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        overrides = [f"run.dir={tmp / 'run'}"]
        if args.model == "tiny":
            overrides.append(f"model.name={build_tiny_model(tmp / 'tiny')}")
        cfg = load_config("cpu", overrides + args.overrides)
        cfg = load_config("cpu", overrides + validation_overrides(cfg, args.validate) + args.overrides)
        totals: dict[str, float] = {}
        start = time.perf_counter()

        def timed_llm(model_cfg):  # generation, and switching adapters (each role's, with train.adapters per_role)
            return Timed(Timed(load_llm(model_cfg), "generation", ("generate",), totals), "adapter loads",
                         ("use_adapter",), totals)

        built = [timed_llm(cfg.model)]
        load_s = time.perf_counter() - start
        # The session's engines build the generation backend, as in `sage run`, so the train stage can release
        # it: the factory is patched (bench only) to hand out the one loaded above, then timed new ones
        # (reloading after training is glue).
        llm_package.load_llm = lambda model_cfg: built.pop() if built else timed_llm(model_cfg)
        engines = {}
        engines["sandbox"] = Timed(Sandbox(cfg.sandbox), "sandbox", ("execute",), totals)
        engines["mathcheck"] = Timed(MathChecker(cfg.mathcheck), "math checks", ("check_many",), totals)
        memory = PeakMemory()
        with Session(cfg.run.dir, engines=engines, display=stage_namer(memory)) as s:
            run_id = s.create_run(cfg, "bench")
            ctx = s.context(run_id, 0)
            run_recorded(ctx, "seed", seed_stage.run, run_id=seed_stage.seeds_key(ctx), iteration=0)  # not timed
            _warm_up_prefect()  # the ephemeral API server starts once per process, not per iteration
            with memory:
                for k in range(1, args.iterations + 1):
                    totals.clear()
                    memory.peaks, memory.own = {}, {}
                    start = time.perf_counter()
                    evolve_flow(str(cfg.run.dir), run_id, k)  # iterations before k are done: it runs k
                    wall = time.perf_counter() - start
                    stages = {r["stage"]: r["seconds"] for r in stage_states(s.warehouse, run_id)
                              if r["iteration"] == k}
                    totals["training (train stage)"] = stages.get("train", 0.0)
                    # the rollouts this call generated: iteration k's, and the base model's validation in the first
                    tokens = s.warehouse.scalar("SELECT sum(completion_tokens) FROM rollouts WHERE run_id = ? AND "
                                                "iteration BETWEEN ? AND ?", [run_id, 0 if k == 1 else k, k]) or 0
                    _report(k, args.model, load_s, totals, wall, stages, dict(memory.peaks), dict(memory.own), tokens)


def _report(k: int, model: str, load_s: float, totals: dict[str, float], wall: float, stages: dict[str, float],
            peaks: dict[str, int], own: dict[str, int], tokens: int) -> None:
    adapter = "the base model" if k == 1 else f"iteration {k - 1}'s adapter"
    print(f"\niteration {k}, model {model}, generating with {adapter} (load {load_s:.1f} s, not counted)")
    print(f"{'part':<28}{'seconds':>10}{'share':>9}")
    for label, secs in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{label:<28}{secs:>10.2f}{secs / wall:>9.1%}")
    glue = wall - sum(totals.values())
    print(f"{'glue (Prefect, DuckDB, Python)':<28}{glue:>10.2f}{glue / wall:>9.1%}")
    print(f"{'wall':<28}{wall:>10.2f}{1:>9.1%}")
    generation = totals.get("generation", 0.0)
    print(f"generated {tokens:,} completion tokens (validation's included)"
          + (f", {1000 * generation / tokens:.2f} ms of generation a token" if tokens else ""))
    print("\nper stage (s): " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    for label, values in (("this process", own), ("with children", peaks)):
        print(f"peak resident memory per stage (GiB, {label}): "
              + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in values.items()))
    print(f"peak overall: {max(own.values(), default=0) / 2**30:.2f} GiB this process, "
          f"{max(peaks.values(), default=0) / 2**30:.2f} GiB with children", flush=True)


if __name__ == "__main__":
    main()
