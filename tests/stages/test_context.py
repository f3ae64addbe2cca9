"""The engines a stage context builds: released on request (the train stage frees the generation model)."""

from __future__ import annotations

import pytest

import sage.engines.llm
from sage.configs import load_config
from sage.stages.context import Engines

pytestmark = pytest.mark.fast


class _Model:
    def __init__(self):
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_released_engine_is_closed_and_built_again_on_next_use_and_a_given_one_stays(monkeypatch):
    monkeypatch.setattr(sage.engines.llm, "load_llm", lambda cfg: _Model())
    engines = Engines(load_config("cpu"))
    first = engines.llm
    engines.release("llm")
    assert first.closed
    second = engines.llm
    assert second is not first and not second.closed
    engines.release("sandbox")  # never built: nothing to do

    given = _Model()
    engines = Engines(load_config("cpu"), llm=given)
    engines.release("llm")
    assert engines.llm is given and not given.closed
