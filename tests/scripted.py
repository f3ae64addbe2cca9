"""ScriptedLLM: a generator that returns completions chosen by the test, named so everywhere it is used.

It implements the `sage.engines.llm.base.LLM` interface so stage logic (admission, gating, every reward path) runs
on known values. `script(request) -> str | list[str]` decides the text of each completion from the request's
messages; token ids are the UTF-8 bytes, log-probs a constant. Never used outside tests.
"""

from __future__ import annotations

from collections.abc import Callable

from sage.engines.llm.base import Completion, GenRequest, GenResult


class ScriptedLLM:
    model_name = "scripted"

    def __init__(self, script: Callable[[GenRequest], str | list[str]]):
        self.script = script
        self.adapter: str | None = None
        self.calls: list[int] = []          # batch sizes, to check stages submit whole batches
        self.requests: list[GenRequest] = []  # every request seen, in order
        self.adapters_used: list[str | None] = []

    def generate(self, requests: list[GenRequest], progress=None) -> list[GenResult]:
        self.calls.append(len(requests))
        self.requests += requests
        self.adapters_used.append(self.adapter)
        out = []
        for req in requests:
            texts = self.script(req)
            texts = [texts] * req.n if isinstance(texts, str) else list(texts)
            prompt = "\n".join(m["content"] for m in req.messages)
            encoded = [t.encode("utf-8", "replace")[:4096] for t in texts[:req.n]]
            comps = [Completion(text=t, token_ids=list(b), logprobs=[-1.0] * len(b), finish_reason="stop")
                     for t, b in zip(texts, encoded)]
            out.append(GenResult(prompt_text=prompt, prompt_ids=list(prompt.encode("utf-8"))[:4096], completions=comps))
        return out

    def use_adapter(self, path: str | None) -> None:
        self.adapter = path

    def close(self) -> None:
        pass


def prompt_text(req: GenRequest) -> str:
    return req.messages[-1]["content"]
