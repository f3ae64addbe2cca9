"""experiments.prompts measures the prompts of the config's prompt set (`roles.prompts`), as the stages render them."""

from __future__ import annotations

import pytest

from experiments.prompts import measure
from sage.configs import load_config
from sage.engines.llm.base import Completion, GenResult
from sage.stages.prompts import render

pytestmark = pytest.mark.fast


class _Recorder:
    """An engine that records the requests and answers each with a fixed reply."""

    def __init__(self):
        self.requests = []

    def generate(self, requests):
        self.requests += requests
        return [GenResult("", [], [Completion("<score>5</score>", [1], None, "stop")]) for _ in requests]


@pytest.mark.parametrize("prompt_set", ["short", "reasoning"])
def test_measure_renders_the_configs_prompt_set(prompt_set):
    cfg = load_config("cpu", [f"roles.prompts={prompt_set}", "roles.challenger.constrain=false",
                              "roles.planner.constrain=false"])
    problems = [{"domain": "math", "text": "What is 2 + 3?", "verifier": {"answer": "5"}},
                {"domain": "code", "text": "Write add(a, b).", "verifier": {"entry_point": "add"}}]
    llm = _Recorder()
    _, records = measure(llm, cfg, problems, roles=["challenger", "planner", "critic"], n_roles=2)
    fields = [{"question": "What is 2 + 3?"}, {"question": "Write add(a, b).", "signature": "add"}]
    want = [render(kind, prompt_set=prompt_set, **f) for f in fields
            for kind in (f"challenger_{'math' if 'signature' not in f else 'code'}", "planner", "critic_question")]
    assert [r.messages for r in llm.requests] == want and len(records) == 6
