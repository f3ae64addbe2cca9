"""The `vllm` backend against a fake of vLLM's documented offline API, plus a real run where CUDA is.

`FakeVLLM*` mirror the parts of vLLM (0.12-0.31) the backend uses: `vllm.LLM(**engine_args)`,
`LLM.generate(prompts, sampling_params=[...], use_tqdm=, lora_request=)` returning `RequestOutput`s whose
`outputs` are `CompletionOutput(index, text, token_ids, logprobs=[{token_id: Logprob(logprob=...)}],
finish_reason)`, `SamplingParams(...)`, `StructuredOutputsParams(regex=)` and `LoRARequest(name, id, path)`.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest

from configs.schema import ModelConfig
from engines.llm import GenRequest, load_llm, sample_seed


@dataclass
class FakeVLLMSamplingParams:
    n: int = 1
    seed: int | None = None
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    logprobs: int | None = None
    structured_outputs: object = None


@dataclass
class FakeVLLMStructuredOutputsParams:
    regex: str | None = None


@dataclass
class FakeVLLMLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass
class FakeVLLMLogprob:
    logprob: float


@dataclass
class FakeVLLMCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict] | None
    finish_reason: str
    cumulative_logprob: float | None = None


@dataclass
class FakeVLLMRequestOutput:
    prompt_token_ids: list[int]
    outputs: list[FakeVLLMCompletionOutput] = field(default_factory=list)


class FakeVLLMLLM:
    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        FakeVLLMLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, use_tqdm=True, lora_request=None):
        self.calls.append(dict(prompts=prompts, params=sampling_params, lora=lora_request, use_tqdm=use_tqdm))
        outs = []
        for prompt, sp in zip(prompts, sampling_params):
            k = sp.seed % 5 + 1  # "generates" min(k, max_tokens) tokens; EOS (id 2) when k fits
            toks = [40 + i for i in range(min(k, sp.max_tokens))]
            finish = "length" if k > sp.max_tokens else "stop"
            if finish == "stop":
                toks.append(2)
            lps = [{t: FakeVLLMLogprob(-0.5 - i)} for i, t in enumerate(toks)] if sp.logprobs is not None else None
            outs.append(FakeVLLMRequestOutput(prompt["prompt_token_ids"], [
                FakeVLLMCompletionOutput(0, f"text{len(toks)}", toks, lps, finish)]))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = FakeVLLMLLM, FakeVLLMSamplingParams
    sp = types.ModuleType("vllm.sampling_params")
    sp.SamplingParams, sp.StructuredOutputsParams = FakeVLLMSamplingParams, FakeVLLMStructuredOutputsParams
    lora = types.ModuleType("vllm.lora")
    lreq = types.ModuleType("vllm.lora.request")
    lreq.LoRARequest = FakeVLLMLoRARequest
    for name, m in {"vllm": mod, "vllm.sampling_params": sp, "vllm.lora": lora, "vllm.lora.request": lreq}.items():
        monkeypatch.setitem(sys.modules, name, m)
    FakeVLLMLLM.instances = []
    return mod


def _cfg(tiny_model, **kw):
    return ModelConfig(name=str(tiny_model), backend="vllm", **kw)


def test_engine_is_built_with_lora_and_parallelism(fake_vllm, tiny_model):
    llm = load_llm(_cfg(tiny_model, tensor_parallel_size=2, data_parallel_size=2, max_lora_rank=64,
                        gpu_memory_utilization=0.5, max_model_len=1024, dtype="bfloat16"))
    kw = FakeVLLMLLM.instances[0].kwargs
    assert kw["model"] == str(tiny_model) and kw["enable_lora"] is True and kw["max_lora_rank"] == 64
    assert (kw["tensor_parallel_size"], kw["data_parallel_size"]) == (2, 2)
    assert (kw["gpu_memory_utilization"], kw["max_model_len"], kw["dtype"]) == (0.5, 1024, "bfloat16")
    assert kw["logprobs_mode"] == "raw_logprobs"
    load_llm(_cfg(tiny_model))  # one engine replica: vLLM's own default, not passed
    assert "data_parallel_size" not in FakeVLLMLLM.instances[1].kwargs
    assert llm.model_name == str(tiny_model) and llm.adapter is None


def test_whole_batch_in_one_call_with_per_sample_seeds(fake_vllm, tiny_model):
    llm = load_llm(_cfg(tiny_model, max_model_len=256))
    reqs = [GenRequest([{"role": "user", "content": "What is 7 * 8?"}], n=3, max_new_tokens=3, temperature=0.7,
                       top_p=0.9, seed=10, regex=r"<score>[0-9]</score>"),
            GenRequest([{"role": "user", "content": "abc"}], n=1, max_new_tokens=500, temperature=0, seed=4)]
    calls = []
    results = llm.generate(reqs, progress=lambda *a: calls.append(a))
    engine = FakeVLLMLLM.instances[0]
    assert len(engine.calls) == 1 and engine.calls[0]["lora"] is None and engine.calls[0]["use_tqdm"] is False
    call = engine.calls[0]
    assert len(call["prompts"]) == len(call["params"]) == 4
    ids0 = llm.tokenizer.apply_chat_template(reqs[0].messages, add_generation_prompt=True, tokenize=False)
    assert results[0].prompt_text == ids0
    assert call["prompts"][0] == {"prompt_token_ids": results[0].prompt_ids}
    for j, sp in enumerate(call["params"][:3]):
        assert (sp.n, sp.seed, sp.max_tokens, sp.temperature, sp.top_p, sp.logprobs) == \
            (1, sample_seed(10, j), 3, 0.7, 0.9, 0)
        assert sp.structured_outputs.regex == r"<score>[0-9]</score>"
    last = call["params"][3]
    assert last.structured_outputs is None and last.temperature == 0
    assert last.max_tokens == 256 - len(results[1].prompt_ids), "capped by max_model_len"
    # conversion: order, token ids, log-probs, finish reasons
    assert [len(r.completions) for r in results] == [3, 1]
    for j, c in enumerate(results[0].completions):
        k = sample_seed(10, j) % 5 + 1
        if k > 3:
            assert c.finish_reason == "length" and c.token_ids == [40, 41, 42]
        else:
            assert c.finish_reason == "stop" and c.token_ids == [40 + i for i in range(k)] + [2]
        assert c.logprobs == [-0.5 - i for i in range(len(c.token_ids))] and c.text == f"text{len(c.token_ids)}"
    total = sum(len(c.token_ids) for r in results for c in r.completions)
    assert calls == [(2, 2, total)]


def test_each_adapter_version_gets_a_new_lora_request(fake_vllm, tiny_model):
    llm = load_llm(_cfg(tiny_model))
    req = [GenRequest([{"role": "user", "content": "hi"}], max_new_tokens=2)]
    llm.use_adapter("/ckpt/iter-1")
    llm.generate(req)
    llm.use_adapter("/ckpt/iter-2")
    llm.generate(req)
    llm.use_adapter("/ckpt/iter-1")
    llm.generate(req)
    llm.use_adapter(None)
    llm.generate(req)
    loras = [c["lora"] for c in FakeVLLMLLM.instances[0].calls]
    assert [(r.lora_int_id, r.lora_path) for r in loras[:3]] == [(1, "/ckpt/iter-1"), (2, "/ckpt/iter-2"),
                                                                (3, "/ckpt/iter-1")]
    assert len({r.lora_name for r in loras[:3]}) == 3 and loras[3] is None and llm.adapter is None


@pytest.mark.gpu
def test_real_vllm_generates_with_seeds_and_logprobs(tiny_model):
    pytest.importorskip("vllm")
    llm = load_llm(_cfg(tiny_model, max_model_len=512, gpu_memory_utilization=0.3, dtype="float32"))
    req = GenRequest([{"role": "user", "content": "What is 7 * 8?"}], n=2, max_new_tokens=8, seed=3,
                     regex=r"<score>[0-9]</score>")
    a, b = llm.generate([req])[0], llm.generate([req])[0]
    assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
    for c in a.completions:
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason == "length" or c.text.startswith("<score>")
    llm.close()
