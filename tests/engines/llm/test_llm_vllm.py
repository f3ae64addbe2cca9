"""The `vllm` backend against a fake of vLLM's documented API, plus real runs where CUDA is.

`FakeVLLM*` mirror the parts of vLLM (0.12-0.31) the backend uses: `vllm.LLM(**engine_args)`,
`LLM.generate(prompts, sampling_params=[...], use_tqdm=, lora_request=)` returning `RequestOutput`s whose
`outputs` are `CompletionOutput(index, text, token_ids, logprobs=[{token_id: Logprob(logprob=...)}],
finish_reason)`, `SamplingParams(...)`, `StructuredOutputsParams(regex=)` and `LoRARequest(name, id, path)`;
and, for data parallelism, the async engine: `vllm.v1.engine.async_llm.AsyncLLM.from_engine_args(
vllm.engine.arg_utils.AsyncEngineArgs(**engine_args))`, `async generate(prompt, sampling_params, request_id,
*, lora_request=)` yielding `RequestOutput`s (the last with `finished=True`; only that one when
`SamplingParams.output_kind` is `RequestOutputKind.FINAL_ONLY`, else cumulative ones before it) and
`shutdown()`. Sleep mode and adapters: `LLM.sleep(level=, mode=)`, `LLM.wake_up(tags=)`,
`LLM.llm_engine.remove_lora(lora_id)`, and `AsyncLLM`'s coroutines of those names. Every engine call lands in the
engine's `events`; generating while asleep, or sleeping an engine built without `enable_sleep_mode`, fails.
"""

from __future__ import annotations

import asyncio
import enum
import sys
import types
from dataclasses import dataclass, field, replace

import pytest

from sage.configs.schema import ModelConfig
from sage.engines.llm import GenRequest, load_llm, sample_seed


class FakeVLLMRequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class FakeVLLMSamplingParams:
    n: int = 1
    seed: int | None = None
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    logprobs: int | None = None
    structured_outputs: object = None
    output_kind: FakeVLLMRequestOutputKind = FakeVLLMRequestOutputKind.CUMULATIVE


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
    finished: bool = True


def _fake_output(prompt, sp) -> FakeVLLMRequestOutput:
    """The one fake "model" both fake engines run: min(k, max_tokens) tokens, k from the seed."""
    k = sp.seed % 5 + 1  # EOS (id 2) appended when k fits
    toks = [40 + i for i in range(min(k, sp.max_tokens))]
    finish = "length" if k > sp.max_tokens else "stop"
    if finish == "stop":
        toks.append(2)
    lps = [{t: FakeVLLMLogprob(-0.5 - i)} for i, t in enumerate(toks)] if sp.logprobs is not None else None
    return FakeVLLMRequestOutput(prompt["prompt_token_ids"], [
        FakeVLLMCompletionOutput(0, f"text{len(toks)}", toks, lps, finish)])


class FakeVLLMSleep:
    """What both fake engines share: sleep, wake_up and remove_lora, each recorded in `events` with the state it
    found, and the checks vLLM's callers rely on."""

    def _init_sleep(self, kwargs):
        self.events: list[tuple] = []
        self.asleep, self.sleep_mode = False, bool(kwargs.get("enable_sleep_mode"))

    def _generating(self, lora) -> None:
        assert not self.asleep, "generate while the engine sleeps"
        self.events.append(("generate", lora and lora.lora_int_id))

    def _sleep(self, level, mode):
        assert self.sleep_mode, "sleep on an engine built without enable_sleep_mode"
        self.events.append(("sleep", level, mode))
        self.asleep = True

    def _wake_up(self, tags):
        self.events.append(("wake_up", tags))
        self.asleep = False

    def _remove_lora(self, lora_id) -> bool:
        self.events.append(("remove_lora", lora_id, "asleep" if self.asleep else "awake"))
        return True


class FakeVLLMLLM(FakeVLLMSleep):
    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        self._init_sleep(kwargs)
        self.llm_engine = types.SimpleNamespace(remove_lora=self._remove_lora)
        FakeVLLMLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, use_tqdm=True, lora_request=None):
        self._generating(lora_request)
        self.calls.append(dict(prompts=prompts, params=sampling_params, lora=lora_request, use_tqdm=use_tqdm))
        return [_fake_output(prompt, sp) for prompt, sp in zip(prompts, sampling_params)]

    def sleep(self, level=1, mode="abort"):
        self._sleep(level, mode)

    def wake_up(self, tags=None):
        self._wake_up(tags)


class FakeVLLMAsyncEngineArgs:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeVLLMAsyncLLM(FakeVLLMSleep):
    """Fake of `AsyncLLM`: records calls, the event loop it runs on, and the peak of concurrent requests."""

    instances: list = []

    def __init__(self, engine_args):
        self.kwargs, self.calls, self.in_flight, self.peak = engine_args.kwargs, [], 0, 0
        self._init_sleep(self.kwargs)
        self.loop = asyncio.get_running_loop()  # fails unless built inside an event loop
        self.shutdown_in_loop = None
        FakeVLLMAsyncLLM.instances.append(self)

    @classmethod
    def from_engine_args(cls, engine_args, start_engine_loop=True, usage_context=None, stat_loggers=None):
        return cls(engine_args)

    async def generate(self, prompt, sampling_params, request_id, *, lora_request=None, **kwargs):
        assert asyncio.get_running_loop() is self.loop
        self._generating(lora_request)
        self.calls.append(dict(prompt=prompt, params=sampling_params, request_id=request_id, lora=lora_request))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            for _ in range(3):  # let every submitted request start before any finishes
                await asyncio.sleep(0)
            final = _fake_output(prompt, sampling_params)
            if sampling_params.output_kind is not FakeVLLMRequestOutputKind.FINAL_ONLY:
                c = final.outputs[0]
                yield FakeVLLMRequestOutput(final.prompt_token_ids, [FakeVLLMCompletionOutput(
                    0, "", c.token_ids[:1], c.logprobs and c.logprobs[:1], None)], finished=False)
            yield final
        finally:
            self.in_flight -= 1

    async def sleep(self, level=1, mode="abort"):
        assert asyncio.get_running_loop() is self.loop
        self._sleep(level, mode)

    async def wake_up(self, tags=None):
        assert asyncio.get_running_loop() is self.loop
        self._wake_up(tags)

    async def remove_lora(self, lora_id):
        assert asyncio.get_running_loop() is self.loop
        return self._remove_lora(lora_id)

    def shutdown(self):
        try:
            self.shutdown_in_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            self.shutdown_in_loop = False


@pytest.fixture
def fake_vllm(monkeypatch):
    mods = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.sampling_params", "vllm.lora", "vllm.lora.request", "vllm.engine", "vllm.engine.arg_utils",
        "vllm.v1", "vllm.v1.engine", "vllm.v1.engine.async_llm")}
    mods["vllm"].LLM, mods["vllm"].SamplingParams = FakeVLLMLLM, FakeVLLMSamplingParams
    sp = mods["vllm.sampling_params"]
    sp.SamplingParams, sp.StructuredOutputsParams = FakeVLLMSamplingParams, FakeVLLMStructuredOutputsParams
    sp.RequestOutputKind = FakeVLLMRequestOutputKind
    mods["vllm.lora.request"].LoRARequest = FakeVLLMLoRARequest
    mods["vllm.engine.arg_utils"].AsyncEngineArgs = FakeVLLMAsyncEngineArgs
    mods["vllm.v1.engine.async_llm"].AsyncLLM = FakeVLLMAsyncLLM
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    FakeVLLMLLM.instances, FakeVLLMAsyncLLM.instances = [], []
    return mods["vllm"]


def _cfg(tiny_model, **kw):
    return ModelConfig(name=str(tiny_model), backend="vllm", **kw)


def test_engine_is_built_with_lora_and_parallelism(fake_vllm, tiny_model):
    llm = load_llm(_cfg(tiny_model, tensor_parallel_size=2, max_lora_rank=64, gpu_memory_utilization=0.5,
                        max_model_len=1024, dtype="bfloat16"))
    kw = FakeVLLMLLM.instances[0].kwargs
    assert kw["model"] == str(tiny_model) and kw["enable_lora"] is True and kw["max_lora_rank"] == 64
    assert kw["tensor_parallel_size"] == 2 and "data_parallel_size" not in kw  # vLLM's LLM refuses it
    assert (kw["gpu_memory_utilization"], kw["max_model_len"], kw["dtype"]) == (0.5, 1024, "bfloat16")
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enable_sleep_mode"] is True
    assert llm.model_name == str(tiny_model) and llm.adapter is None and not FakeVLLMAsyncLLM.instances


def test_data_parallel_builds_the_async_engine_with_the_same_arguments(fake_vllm, tiny_model):
    kw = dict(tensor_parallel_size=2, max_lora_rank=64, gpu_memory_utilization=0.5, max_model_len=1024,
              dtype="bfloat16")
    load_llm(_cfg(tiny_model, **kw))
    llm = load_llm(_cfg(tiny_model, data_parallel_size=2, **kw))
    assert len(FakeVLLMLLM.instances) == 1 and len(FakeVLLMAsyncLLM.instances) == 1
    args = FakeVLLMAsyncLLM.instances[0].kwargs
    assert args == dict(FakeVLLMLLM.instances[0].kwargs, data_parallel_size=2, disable_log_stats=True)
    assert (args["tensor_parallel_size"], args["gpu_memory_utilization"]) == (2, 0.5)
    llm.close()


def _stage_requests():
    return [GenRequest([{"role": "user", "content": "What is 7 * 8?"}], n=3, max_new_tokens=3, temperature=0.7,
                       top_p=0.9, seed=10, regex=r"<score>[0-9]</score>"),
            GenRequest([{"role": "user", "content": "abc"}], n=2, max_new_tokens=500, temperature=0, seed=4),
            GenRequest([{"role": "user", "content": "hi"}], n=1, max_new_tokens=8, seed=7)]


def test_data_parallel_results_equal_the_offline_path(fake_vllm, tiny_model):
    offline = load_llm(_cfg(tiny_model, max_model_len=256))
    dp = load_llm(_cfg(tiny_model, max_model_len=256, data_parallel_size=2))
    for llm in (offline, dp):
        llm.use_adapter("/ckpt/iter-1")
    calls_off, calls_dp = [], []
    expected = offline.generate(_stage_requests(), progress=lambda *a: calls_off.append(a))
    results = dp.generate(_stage_requests(), progress=lambda *a: calls_dp.append(a))
    assert results == expected and calls_dp == calls_off
    engine = FakeVLLMAsyncLLM.instances[0]
    offline_call = FakeVLLMLLM.instances[0].calls[0]
    # every (request, sample) submitted at once, each its own request, with the offline path's prompts and
    # parameters (seeds, max_tokens capped by max_model_len, regex) and only the output kind added
    assert len(engine.calls) == 6 and engine.peak == 6
    assert [c["prompt"] for c in engine.calls] == offline_call["prompts"]
    for c, sp in zip(engine.calls, offline_call["params"]):
        assert c["params"].output_kind is FakeVLLMRequestOutputKind.FINAL_ONLY
        assert replace(c["params"], output_kind=sp.output_kind) == sp
    assert engine.calls[3]["params"].max_tokens == 256 - len(results[1].prompt_ids)
    assert len({c["lora"].lora_int_id for c in engine.calls}) == 1
    assert engine.calls[0]["lora"].lora_path == "/ckpt/iter-1"
    dp.close()


def test_data_parallel_request_ids_are_unique_and_lora_reaches_every_request(fake_vllm, tiny_model):
    llm = load_llm(_cfg(tiny_model, data_parallel_size=2))
    llm.generate(_stage_requests())
    llm.use_adapter("/ckpt/iter-2")
    llm.generate(_stage_requests())
    calls = FakeVLLMAsyncLLM.instances[0].calls
    ids = [c["request_id"] for c in calls]
    assert len(ids) == 12 and len(set(ids)) == 12  # unique across calls too
    assert all(c["lora"] is None for c in calls[:6])
    assert all(c["lora"] is calls[6]["lora"] for c in calls[6:]) and calls[6]["lora"].lora_path == "/ckpt/iter-2"
    llm.close()


def test_data_parallel_takes_the_final_output_and_checks_room(fake_vllm, tiny_model, monkeypatch):
    llm = load_llm(_cfg(tiny_model, data_parallel_size=2, max_model_len=256))
    # an engine that streams (CUMULATIVE) must still give the final output, not the first one
    monkeypatch.setattr(llm, "_params", lambda req, j, room: FakeVLLMSamplingParams(
        seed=sample_seed(req.seed, j), max_tokens=min(req.max_new_tokens, room), logprobs=0))
    (res,) = llm.generate([GenRequest([{"role": "user", "content": "hi"}], n=1, max_new_tokens=8, seed=7)])
    k = sample_seed(7, 0) % 5 + 1
    assert res.completions[0].token_ids == [40 + i for i in range(k)] + [2]
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([GenRequest([{"role": "user", "content": "x " * 400}])])
    assert len(FakeVLLMAsyncLLM.instances[0].calls) == 1
    llm.close()


def test_data_parallel_close_shuts_the_engine_down_in_its_loop(fake_vllm, tiny_model):
    llm = load_llm(_cfg(tiny_model, data_parallel_size=2))
    llm.generate(_stage_requests())
    engine = FakeVLLMAsyncLLM.instances[0]
    llm.close()
    assert engine.shutdown_in_loop is True and engine.loop.is_closed() and llm.engine is None


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


def _vllm_config(tiny_model, *overrides: str):
    from sage.configs import load_config

    return load_config("cpu", [f"model.name={tiny_model}", "model.backend=vllm", "train.isolate=true",
                               "roles.solver.constrain=false", *overrides])


def test_two_iterations_on_one_engine_that_sleeps_through_training(fake_vllm, tiny_model):
    """The flow's order over two iterations: base validation, iteration 1's stages (base model), training,
    validation and iteration 2's stages on adapter 1, training, validation on adapter 2. One engine throughout: it
    sleeps at each train stage's release point (`Engines.suspend`, as stages/train.py calls it), wakes before the
    next generate, never generates asleep, and the adapter each new one replaces is removed from it, awake."""
    from sage.stages.context import Engines, StageContext

    engines = Engines(_vllm_config(tiny_model))
    req = [GenRequest([{"role": "user", "content": "hi"}], max_new_tokens=2)]
    schedule = [(None, 2), ("/ckpt/iter-1", 2), ("/ckpt/iter-2", 1)]  # (adapter, stages that generate with it)
    for adapter, stages in schedule:
        for _ in range(stages):
            ctx = StageContext(cfg=engines.cfg, wh=None, adapter=adapter, engines=engines)
            assert ctx.llm.generate(req)[0].completions
        engines.suspend("llm")  # the train stage
        engines.suspend("llm")  # a re-run train stage: still one sleep
    engine = FakeVLLMLLM.instances[0]
    assert len(FakeVLLMLLM.instances) == 1 and engines.llm.engine is engine
    sleep, wake = ("sleep", 1, "abort"), ("wake_up", None)
    assert engine.events == [("generate", None), ("generate", None), sleep,
                             wake, ("generate", 1), ("generate", 1), sleep,
                             wake, ("remove_lora", 1, "awake"), ("generate", 2), sleep]
    assert engine.calls[-1]["lora"].lora_path == "/ckpt/iter-2"
    engines.close()  # closes a sleeping engine too
    assert engines.llm.engine is not engine and len(FakeVLLMLLM.instances) == 2  # a new one only after close


def test_an_adapter_retrained_at_the_same_path_is_loaded_afresh_after_a_sleep(fake_vllm, tiny_model):
    """The stage context sets the adapter only when its path changes; one retrained in place while the engine
    slept (same path) must still get a new LoRA id, not vLLM's cached weights, and the old id is removed."""
    from sage.stages.context import Engines, StageContext

    engines = Engines(_vllm_config(tiny_model))
    req = [GenRequest([{"role": "user", "content": "hi"}], max_new_tokens=2)]
    for _ in range(2):                   # the same adapter path before and after training
        for _ in range(2):
            ctx = StageContext(cfg=engines.cfg, wh=None, adapter="/ckpt/latest", engines=engines)
            assert ctx.llm.generate(req)[0].completions
        engines.suspend("llm")
    engine = FakeVLLMLLM.instances[0]
    sleep, wake = ("sleep", 1, "abort"), ("wake_up", None)
    assert engine.events == [("generate", 1), ("generate", 1), sleep,
                             wake, ("remove_lora", 1, "awake"), ("generate", 2), ("generate", 2), sleep]
    assert [c["lora"].lora_path for c in engine.calls] == ["/ckpt/latest"] * 4
    engines.close()


class _NoSleep:
    """A backend without sleep mode (as hf): it can only be closed."""

    def __init__(self, built: list):
        self.adapter, self.closed = None, False
        built.append(self)

    def close(self):
        self.closed = True


def test_suspend_releases_a_backend_without_sleep_and_sleeps_a_given_one(monkeypatch, fake_vllm, tiny_model):
    import sage.engines.llm as llm_package
    from sage.configs import load_config
    from sage.stages.context import Engines

    built: list[_NoSleep] = []
    with monkeypatch.context() as patched:
        patched.setattr(llm_package, "load_llm", lambda cfg: _NoSleep(built))
        engines = Engines(load_config("cpu"))
        engines.suspend("llm")  # nothing built yet: nothing to do
        first = engines.llm
        engines.suspend("llm")
        assert first.closed and engines.llm is not first and len(built) == 2  # released, built again on next use
    given = Engines(load_config("cpu"), llm=_NoSleep(built))
    given.suspend("llm")
    assert not built[-1].closed and given.llm is built[-1]  # a given engine is the caller's to close
    vllm = load_llm(_cfg(tiny_model))
    Engines(_vllm_config(tiny_model), llm=vllm).suspend("llm")
    assert vllm.asleep and FakeVLLMLLM.instances[0].events == [("sleep", 1, "abort")]  # sleeping gives nothing up


def test_data_parallel_engine_sleeps_wakes_and_removes_adapters_in_its_loop(fake_vllm, tiny_model):
    llm = load_llm(_cfg(tiny_model, data_parallel_size=2))
    req = [GenRequest([{"role": "user", "content": "hi"}], max_new_tokens=2)]
    llm.use_adapter("/ckpt/iter-1")
    llm.generate(req)
    llm.sleep()
    llm.use_adapter("/ckpt/iter-2")
    llm.generate(req)
    engine = FakeVLLMAsyncLLM.instances[0]
    assert engine.kwargs["enable_sleep_mode"] is True
    assert engine.events == [("generate", 1), ("sleep", 1, "abort"), ("wake_up", None),
                             ("remove_lora", 1, "awake"), ("generate", 2)]
    llm.close()


def _stage(tiny_model, *overrides: str, llm=None):
    from sage.stages.context import Engines, StageContext
    from sage.warehouse import Warehouse

    cfg = _vllm_config(tiny_model, *overrides)
    engines = Engines(cfg) if llm is None else Engines(cfg, llm=llm)
    return StageContext(cfg=cfg, wh=Warehouse.open(":memory:"), run_id="r", iteration=1, engines=engines)


def _commits(ctx, monkeypatch, fail_at: int | None = None) -> list[int]:
    """Rows per `rollouts` commit; the commit numbered `fail_at` (0-based) raises instead, as a crash would."""
    sizes: list[int] = []
    insert = ctx.wh.insert_batch

    def counted(table, rows, *args, **kwargs):
        if table == "rollouts":
            if len(sizes) == fail_at:
                raise KeyboardInterrupt("interrupted mid-stage")
            sizes.append(len(rows))
        return insert(table, rows, *args, **kwargs)

    monkeypatch.setattr(ctx.wh, "insert_batch", counted)
    return sizes


def _units(k: int):
    from sage.stages.rollouts import Unit

    return [Unit("solver_math", f"q{i}", "math", {"question": f"What is {i} + {i}?"}, n=2) for i in range(k)]


def test_a_stage_is_one_generate_call_on_vllm_committed_in_batch_rows(fake_vllm, tiny_model, monkeypatch):
    from sage.configs.names import Purpose, Stage
    from sage.stages.rollouts import generate

    ctx = _stage(tiny_model, "run.batch_rows=4")
    sizes = _commits(ctx, monkeypatch)
    assert generate(ctx, Stage.SOLVE, Purpose.SOLVE, _units(10)) == (10, 20)
    (call,) = FakeVLLMLLM.instances[0].calls  # 10 units, 2 samples each: one engine call of 20 prompts
    assert len(call["prompts"]) == 20
    assert sizes == [8, 8, 4]  # run.batch_rows units (2 rollouts each) per transaction
    assert generate(ctx, Stage.SOLVE, Purpose.SOLVE, _units(10)) == (0, 0)  # a finished stage: nothing to do
    assert len(FakeVLLMLLM.instances[0].calls) == 1
    ctx.close()


def test_hf_keeps_one_generate_call_per_commit(tiny_model, monkeypatch):
    from sage.configs.names import Purpose, Stage
    from sage.stages.rollouts import generate
    from tests.scripted import ScriptedLLM

    llm = ScriptedLLM(lambda req: "<answer>4</answer>")
    ctx = _stage(tiny_model, "run.batch_rows=4", "model.backend=hf", llm=llm)
    sizes = _commits(ctx, monkeypatch)
    generate(ctx, Stage.SOLVE, Purpose.SOLVE, _units(10))
    assert llm.calls == [4, 4, 2] and sizes == [8, 8, 4]
    ctx.close()


def test_an_interrupted_vllm_stage_redoes_only_the_uncommitted_units(fake_vllm, tiny_model, monkeypatch):
    from sage.configs.names import Purpose, Stage
    from sage.stages.rollouts import generate

    ctx = _stage(tiny_model, "run.batch_rows=4")
    with monkeypatch.context() as patched:
        sizes = _commits(ctx, patched, fail_at=1)
        with pytest.raises(KeyboardInterrupt):
            generate(ctx, Stage.SOLVE, Purpose.SOLVE, _units(10))
    assert sizes == [8]  # the first commit landed, the rest of the one call's generation is lost
    assert generate(ctx, Stage.SOLVE, Purpose.SOLVE, _units(10)) == (6, 12)
    first, again = FakeVLLMLLM.instances[0].calls
    assert len(again["prompts"]) == 12  # units 4..9 only, with the samples (seeds) they had the first time
    assert [sp.seed for sp in again["params"]] == [sp.seed for sp in first["params"]][8:]
    rows = ctx.wh.rows("SELECT question_id, sample_index, seed, completion_ids FROM rollouts ORDER BY question_id, "
                       "sample_index")
    assert len(rows) == 20 and {r["question_id"] for r in rows} == {f"q{i}" for i in range(10)}
    ctx.close()


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


@pytest.mark.gpu
def test_real_vllm_data_parallel_generates_with_seeds_and_logprobs(tiny_model):
    pytest.importorskip("vllm")
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("data parallelism needs 2 GPUs")
    llm = load_llm(_cfg(tiny_model, max_model_len=512, gpu_memory_utilization=0.3, dtype="float32",
                        data_parallel_size=2))
    reqs = [GenRequest([{"role": "user", "content": f"What is {i} * 8?"}], n=2, max_new_tokens=8, seed=i)
            for i in range(8)]
    a, b = llm.generate(reqs), llm.generate(reqs)
    assert [[c.token_ids for c in r.completions] for r in a] == [[c.token_ids for c in r.completions] for r in b]
    for c in (c for r in a for c in r.completions):
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
    llm.close()


@pytest.mark.gpu
def test_real_vllm_sleep_frees_memory_and_adapters_swap_in_the_same_engine(tiny_model, tmp_path):
    pytest.importorskip("vllm")
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapters = []
    for k in range(2):
        torch.manual_seed(k)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                               LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False))
        model.save_pretrained(tmp_path / f"adapter-{k}")
        adapters.append(str(tmp_path / f"adapter-{k}"))
    llm = load_llm(_cfg(tiny_model, max_model_len=512, gpu_memory_utilization=0.3, dtype="float32"))
    req = [GenRequest([{"role": "user", "content": "What is 7 * 8?"}], n=2, max_new_tokens=8, seed=3)]
    before = [c.token_ids for c in llm.generate(req)[0].completions]
    awake = torch.cuda.mem_get_info()[0]
    llm.sleep()
    asleep = torch.cuda.mem_get_info()[0]
    assert asleep - awake > 0.2 * torch.cuda.mem_get_info()[1]  # the KV cache (30% of the GPU) and weights freed
    assert [c.token_ids for c in llm.generate(req)[0].completions] == before  # woken, the same samples
    engine = llm.engine
    for path in adapters:
        llm.use_adapter(path)
        assert all(c.token_ids for c in llm.generate(req)[0].completions)
        llm.sleep()
    llm.use_adapter(None)
    llm.generate(req)
    assert llm.engine is engine and engine.llm_engine.list_loras() == set()  # both adapters removed again
    llm.close()
