"""Fan-out on Ray (`orchestration.runner: ray`): a stage's chunks run as Prefect tasks through prefect-ray's
`RayTaskRunner`, implementing the interface of `sage.stages.fanout`. The flow's session builds it and injects
it into the stage contexts; ray and prefect-ray are imported only when the runner is `ray`.

Each chunk task carries plain data (the chunk function, the sandbox and math-checker config sections, the
rows); each Ray worker process builds its own sandbox and math checker once and reuses them. Results come
back to the flow process in input order, which alone writes the warehouse.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from importlib.util import find_spec
from typing import Any

from sage.configs.schema import MathCheckConfig, OrchestrationConfig, SageConfig, SandboxConfig
from sage.stages.fanout import ChunkFn

RAY_MISSING = "orchestration.runner is 'ray' but {name} is not installed: install the ray extra: " \
              "pip install 'sage-evolve[ray]'"


def require_ray() -> None:
    """Fail at the start of a flow, not after an hour of generation, when Ray is asked for but absent."""
    for name in ("ray", "prefect_ray"):
        if find_spec(name) is None:
            raise ImportError(RAY_MISSING.format(name=name))


# ------------------------------------------------------------------------------------------ Ray worker side

class WorkerEngines:
    """A Ray worker process's sandbox and math checker. Sized to the CPUs its task reserves, since Ray already
    runs one task per reserved CPU on every node (a full-size pool per task would oversubscribe the node)."""

    def __init__(self, sections: dict):
        self.sections = sections
        self._sandbox = self._mathcheck = None

    @property
    def sandbox(self):
        if self._sandbox is None:
            from sage.engines.verify.sandbox import Sandbox

            cfg = SandboxConfig(**self.sections["sandbox"])
            self._sandbox = Sandbox(cfg.model_copy(update={"workers": cfg.workers or 2 * self.sections["cpus"]}))
        return self._sandbox

    @property
    def mathcheck(self):
        if self._mathcheck is None:
            from sage.engines.verify.mathcheck import MathChecker

            cfg = MathCheckConfig(**self.sections["mathcheck"])
            self._mathcheck = MathChecker(cfg, workers=self.sections["cpus"])
        return self._mathcheck


_WORKER_ENGINES: dict[str, WorkerEngines] = {}  # per Ray worker process, reused by every chunk it runs


def run_chunk(fn: ChunkFn, sections: dict, rows: list, label: str) -> list:
    """The body of one remote task (`label` names its task run in the Prefect UI)."""
    key = json.dumps(sections, sort_keys=True)
    if key not in _WORKER_ENGINES:
        _WORKER_ENGINES[key] = WorkerEngines(sections)
    return fn(_WORKER_ENGINES[key], rows)


# ------------------------------------------------------------------------------------------ flow side

class RaySession:
    """The entered RayTaskRunner of one flow process; closing it stops the Ray instance if it started one."""

    def __init__(self, orch: OrchestrationConfig):
        require_ray()
        from prefect import task
        from prefect.cache_policies import NONE
        from prefect_ray import RayTaskRunner

        # Worker logs stay out of the CLI's progress display (task logs reach the Prefect UI); a private
        # instance skips the dashboard. Ray Client (ray://) forwards extra arguments to the server: none.
        init: dict[str, Any] = {}
        address = orch.ray_address
        if address is None:
            init = {"include_dashboard": False, "log_to_driver": False, "num_cpus": orch.ray_num_cpus}
        elif address == "auto":  # RayTaskRunner reads address "auto" as "start a local instance"
            init, address = {"address": "auto", "log_to_driver": False}, None
        self.runner = RayTaskRunner(address=address, init_kwargs=init).__enter__()
        self.task = task(run_chunk, name="fanout", task_run_name="{label}", cache_policy=NONE,
                         persist_result=False)
        self.cpus = orch.task_cpus

    def close(self) -> None:
        if self.runner is not None:
            self.runner.__exit__(None, None, None)
            self.runner = None


def _worker_api():
    """Ray workers record their task runs through the flow's Prefect API, which travels in the serialised
    settings. Without PREFECT_API_URL the flow talks to an ephemeral server that only it knows: name that
    one, else every worker process would start a temporary server of its own."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, temporary_settings

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return nullcontext()
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()  # a no-op inside a flow, where the flow's client already started it
    return temporary_settings(updates={PREFECT_API_URL: server.api_url})


class Ray:
    """Every chunk submitted at once as a Prefect task on Ray; results yielded in input order, `batch` rows
    at most per list (what a stage commits together), however big the tasks. Chunk tasks nest under the
    stage task that submits them; stage tasks take plain parameters, so nothing unpicklable travels."""

    MIN_AUTO_CHUNK = 16  # below this a task's bookkeeping outweighs its work (bench/scale.py)

    def __init__(self, session: RaySession, cfg: SageConfig):
        self.session = session
        self.chunk_size = cfg.orchestration.chunk_size
        self.sections = {"sandbox": cfg.sandbox.model_dump(), "mathcheck": cfg.mathcheck.model_dump(),
                         "cpus": cfg.orchestration.task_cpus}

    def rows_per_task(self, n: int) -> int:
        """orchestration.chunk_size, or for 0 two tasks per Ray CPU slot of the cluster as it is now."""
        if self.chunk_size:
            return self.chunk_size
        import ray

        slots = max(1, int(ray.cluster_resources().get("CPU", 1) // self.session.cpus))
        return max(self.MIN_AUTO_CHUNK, -(-n // (2 * slots)))

    def map(self, fn: ChunkFn, items: list, batch: int | None = None) -> Iterator[list]:
        from prefect_ray.context import remote_options

        step, name = self.rows_per_task(len(items)), fn.__module__.rsplit(".", 1)[-1]
        with _worker_api(), remote_options(num_cpus=self.session.cpus):
            futures = [self.session.runner.submit(self.session.task, {
                "fn": fn, "sections": self.sections, "rows": items[start:start + step],
                "label": f"{name} rows {start}-{min(start + step, len(items)) - 1}"})
                for start in range(0, len(items), step)]
        for future in futures:
            result = future.result()
            size = batch or len(result) or 1
            for start in range(0, len(result), size):
                yield result[start:start + size]
