"""How a stage fans out its parallel work (verification, scoring): the interface stages call, and the local
implementation. The flow decides where the work runs and injects the fan-out into the stage's context
(`ctx.fanout`): `Local` here, or Prefect tasks on Ray (`sage.flows.fanout`); stages import neither Prefect
nor Ray.

A stage hands `ctx.fanout.map(fn, items, batch)` a module-level function `fn(engines, chunk) -> list` and
plain rows; it gets the results back in input order, in lists of at most `batch` rows (what it commits
together), as they become ready. `engines` is whatever offers `.sandbox` and `.mathcheck`: the context's
own engines when local, a per-process cache on a Ray worker. Only the flow process writes the warehouse.
"""
# pyright: basic

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

ChunkFn = Callable[[Any, list], list]


class Fanout(Protocol):
    def map(self, fn: ChunkFn, items: list, batch: int | None = None) -> Iterator[list]: ...


class Local:
    """Chunks of `batch` rows (all at once without one), one after the other, with the given engines' pools."""

    def __init__(self, engines: Any):
        self.engines = engines

    def map(self, fn: ChunkFn, items: list, batch: int | None = None) -> Iterator[list]:
        step = batch or max(1, len(items))
        for start in range(0, len(items), step):
            yield fn(self.engines, items[start:start + step])
