"""vLLM backend (GPU only): a whole stage's requests in one `vllm.LLM.generate` call (or, with data
parallelism, all at once as concurrent async-engine requests).

- Prompts are rendered with the tokenizer's chat template here (the same code as the `hf` backend) and
  passed as token prompts, so `GenResult.prompt_ids` are exactly what the engine saw.
- A request with `n` samples becomes `n` engine prompts with `n=1` and seed `sample_seed(seed, j)`, so
  completion j does not depend on `n` and matches the `hf` backend's seeding scheme; vLLM's prefix cache
  shares the prompt's KV blocks between them. Per-request seeds cost nothing on vLLM 0.31's default sampler
  (Model Runner V2 on CUDA: every request carries a seed, given or drawn, and one Triton Gumbel-max kernel
  samples the whole batch from hashes of (seed, position, token), so a sample does not depend on the batch).
  They only rule out FlashInfer's fused top-k/top-p sampler, which returning processed log-probs (always
  asked here) rules out anyway. The V1 runner (`VLLM_USE_V2_MODEL_RUNNER=0`, or a feature V2 lacks) draws a
  seeded request's noise in a Python loop, one kernel launch per seeded request per step.
- `logprobs=0` returns the sampled token's log-prob only; the engine is built with
  `logprobs_mode="processed_logprobs"`: log-softmax of the logits after temperature scaling (the behaviour
  policy the trainer compares with, as in TRL's vLLM path), the quantity the `hf` backend returns when top_p
  is 1 (see `engines/llm/base.py`).
- `regex` becomes `SamplingParams(structured_outputs=StructuredOutputsParams(regex=...))` (vLLM >= 0.12
  names; xgrammar is vLLM's default structured-output backend).
- `use_adapter(path)` makes a new `LoRARequest(name, int_id, path)` with a new integer id every time, so a
  retrained adapter written to a new (or the same) directory is never served from vLLM's adapter cache; the
  same engine serves it (vLLM loads it on its first request), and the id it replaces is removed from the
  engine (`remove_lora`) before the next generate, so 200 iterations hold one adapter, not 200 (vLLM's own LRU
  cache, `max_cpu_loras`, would evict it too, but only when the next one loads). The stage context calls
  `use_adapter` only when the path changes, so `sleep()` (training is next) retires the current id the same
  way and clears `adapter`: an adapter retrained in place, at an unchanged path, is set and loaded afresh after
  the engine wakes, never served from the cache.
- Sleep mode (`Sleeps`): the engine is built with `enable_sleep_mode=True`; `sleep()` is `LLM.sleep(level=1)`:
  the weights (LoRA slots included: vLLM allocates them with the weights) move to CPU memory, the KV cache
  is dropped and the prefix cache reset, so no block computed before training is reused after. Level 1 keeps
  the base weights, which LoRA training leaves unchanged; level 2 would reload them. The next `generate` calls
  `wake_up()` first. The data-parallel engine sleeps and wakes every replica (vLLM sends the call to each).
- `model.data_parallel_size > 1`: vLLM's offline `LLM` refuses `data_parallel_size` ("not supported for
  single-process usage and may hang"); data parallelism lives in its async engine, which starts one engine-core
  process per replica and balances requests between them (`vllm serve --data-parallel-size`, and vLLM's own
  `tests/v1/distributed/test_async_llm_dp.py`, build it as `AsyncLLM.from_engine_args(AsyncEngineArgs(...))`
  in one process). `_AsyncEngine` puts that engine behind the offline `LLM.generate` call shape, so prompts,
  seeds, LoRA requests, the room check and the result conversion are the same code for both.
"""

from __future__ import annotations

import uuid

from sage.configs.schema import ModelConfig
from sage.engines.llm.base import Completion, GenRequest, GenResult, ProgressFn, sample_seed
from sage.engines.llm.models import resolve_model


class VLLMLLM:
    """The `vllm` backend; see the module docstring."""

    def __init__(self, cfg: ModelConfig):
        try:
            import vllm
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise ImportError("model.backend 'vllm' needs vLLM on a CUDA machine: pip install "
                              "'sage-evolve[vllm]', or set model.backend=hf") from e
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.model_name = cfg.name
        self.adapter: str | None = None
        self._lora = None
        self._lora_ids = 0
        self._retired: list[int] = []  # LoRA ids replaced by use_adapter, removed from the engine before it generates
        self.asleep = False
        self.path = resolve_model(cfg.name, cfg.cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {cfg.name!r} has no chat template; use an instruct/chat model")
        kwargs = dict(model=self.path, tokenizer=self.path, enable_lora=True, max_lora_rank=cfg.max_lora_rank,
                      tensor_parallel_size=cfg.tensor_parallel_size, max_model_len=cfg.max_model_len,
                      gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype,
                      logprobs_mode="processed_logprobs", seed=0, enable_sleep_mode=True)
        if cfg.data_parallel_size > 1:
            # the offline LLM turns stats logging off; the async engine would print throughput lines every few s
            self.engine = _AsyncEngine(dict(kwargs, data_parallel_size=cfg.data_parallel_size, disable_log_stats=True))
        else:
            self.engine = vllm.LLM(**kwargs)

    def _params(self, req: GenRequest, j: int, room: int):
        from vllm import SamplingParams

        extra, regex = {}, req.regex_for(j)
        if regex is not None:
            from vllm.sampling_params import StructuredOutputsParams  # pyright: ignore[reportMissingImports]

            extra["structured_outputs"] = StructuredOutputsParams(regex=regex)
        if isinstance(self.engine, _AsyncEngine):
            from vllm.sampling_params import RequestOutputKind  # pyright: ignore[reportMissingImports]

            # The offline LLM sets FINAL_ONLY itself; the async engine defaults to CUMULATIVE, which would
            # rebuild and send the growing token and log-prob lists at every step.
            extra["output_kind"] = RequestOutputKind.FINAL_ONLY
        return SamplingParams(n=1, seed=sample_seed(req.seed, j), max_tokens=min(req.max_new_tokens, room),
                              temperature=req.temperature, top_p=req.top_p, logprobs=0, **extra)

    def generate(self, requests: list[GenRequest], progress: ProgressFn | None = None) -> list[GenResult]:
        results, prompts, params, owner = [], [], [], []
        for i, req in enumerate(requests):
            text = self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=False)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            room = self.cfg.max_model_len - len(ids)
            if room < 1:
                raise ValueError(f"request {i}: prompt has {len(ids)} tokens, model.max_model_len is "
                                 f"{self.cfg.max_model_len}; raise model.max_model_len or shorten the prompt")
            results.append(GenResult(prompt_text=text, prompt_ids=ids, completions=[None] * req.n))
            for j in range(req.n):
                prompts.append({"prompt_token_ids": ids})
                params.append(self._params(req, j, room))
                owner.append((i, j))
        if prompts:
            self._ready()
            outputs = self.engine.generate(prompts, sampling_params=params, use_tqdm=False,
                                           lora_request=self._lora)
            new_tokens = 0
            for (i, j), out in zip(owner, outputs):
                results[i].completions[j] = completion = _convert(out.outputs[0])
                new_tokens += len(completion.token_ids)
            if progress is not None:
                progress(len(requests), len(requests), new_tokens)
        return results

    def use_adapter(self, path: str | None) -> None:
        if self._lora is not None:
            self._retired.append(self._lora.lora_int_id)
        if path is None:
            self._lora, self.adapter = None, None
            return
        from vllm.lora.request import LoRARequest  # pyright: ignore[reportMissingImports]

        self._lora_ids += 1
        self._lora = LoRARequest(f"adapter-{self._lora_ids}", self._lora_ids, str(path))
        self.adapter = str(path)

    def sleep(self) -> None:
        """`LLM.sleep(level=1)`: weights to CPU memory, KV cache dropped; the next `generate` wakes it. The
        adapter is let go too (its LoRA id retired as `use_adapter` retires a replaced one, `adapter` None):
        training runs while the engine sleeps and may rewrite the adapter at the same path, so the next stage
        sets it again and its first generate loads it afresh under a new id (one load an iteration)."""
        self.use_adapter(None)
        if not self.asleep:
            self.engine.sleep(level=1)
            self.asleep = True

    def _ready(self) -> None:
        """Before generating: wake the engine if it sleeps, then remove the adapters `use_adapter` replaced."""
        if self.asleep:
            self.engine.wake_up()
            self.asleep = False
        while self._retired:
            lora_id = self._retired.pop()
            if isinstance(self.engine, _AsyncEngine):
                self.engine.remove_lora(lora_id)
            else:
                self.engine.llm_engine.remove_lora(lora_id)

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if isinstance(engine, _AsyncEngine):
            engine.shutdown()
        del engine
        try:
            import gc

            import torch

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:  # pragma: no cover
            pass


class _AsyncEngine:
    """vLLM's async engine (`AsyncLLM`) with `data_parallel_size` replicas, behind `LLM.generate`'s call shape.

    `generate` submits every prompt at once as its own `AsyncLLM.generate` request (the engine balances them
    over the replicas) and returns the final `RequestOutput`s in prompt order, as `LLM.generate` does. The
    engine runs on a private event loop owned by this object: the engine is built inside it (as vLLM's own
    data-parallel tests do, so its output handler belongs to that loop), each call runs it until the batch is
    done, and `shutdown` runs inside it too, since vLLM closes its asyncio sockets from the engine's loop.
    Callers stay synchronous, like the offline path; a thread that already runs an event loop cannot call it.
    `sleep`, `wake_up` and `remove_lora` run `AsyncLLM`'s coroutines of those names on the same loop; vLLM's
    data-parallel client sends each to every replica.
    """

    def __init__(self, engine_args: dict):
        import asyncio

        from vllm.engine.arg_utils import AsyncEngineArgs  # pyright: ignore[reportMissingImports]
        from vllm.v1.engine.async_llm import AsyncLLM  # pyright: ignore[reportMissingImports]

        async def build():
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args))

        self._loop = asyncio.new_event_loop()
        # vLLM tracks requests by id: ids must not repeat while in flight, so one prefix per engine + a counter.
        self._ids, self._next = uuid.uuid4().hex[:8], 0
        try:
            self.engine = self._loop.run_until_complete(build())
        except BaseException:
            self._loop.close()
            raise

    def generate(self, prompts, sampling_params, use_tqdm=False, lora_request=None):
        ids = [f"sage-{self._ids}-{self._next + k}" for k in range(len(prompts))]
        self._next += len(prompts)
        return self._loop.run_until_complete(self._all(
            [self._final(p, sp, rid, lora_request) for p, sp, rid in zip(prompts, sampling_params, ids)]))

    async def _final(self, prompt, params, request_id, lora_request):
        final = None
        async for out in self.engine.generate(prompt=prompt, sampling_params=params, request_id=request_id,
                                              lora_request=lora_request):
            final = out
        if final is None or not final.finished:
            raise RuntimeError(f"vLLM request {request_id} ended without a finished output")
        return final

    @staticmethod
    async def _all(coros):
        import asyncio

        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            # Cancelling a request's `generate` makes vLLM abort it, so a failed batch leaves no request
            # running on the replicas (or waiting in this loop for the next call).
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def sleep(self, level: int) -> None:
        self._loop.run_until_complete(self.engine.sleep(level=level))

    def wake_up(self) -> None:
        self._loop.run_until_complete(self.engine.wake_up())

    def remove_lora(self, lora_id: int) -> bool:
        return self._loop.run_until_complete(self.engine.remove_lora(lora_id))

    def shutdown(self) -> None:
        import asyncio

        async def stop():
            self.engine.shutdown()
            # then end whatever vLLM left on this loop (its output handler), so the loop closes clean
            rest = asyncio.all_tasks() - {asyncio.current_task()}
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self._loop.run_until_complete(stop())
        finally:
            self._loop.close()


def _convert(out) -> Completion:
    """A vLLM `CompletionOutput` as our `Completion`."""
    token_ids = list(out.token_ids)
    logprobs = None
    if out.logprobs is not None:
        logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, out.logprobs)]
    reason = "length" if out.finish_reason == "length" else "stop"
    return Completion(text=out.text, token_ids=token_ids, logprobs=logprobs, finish_reason=reason)
