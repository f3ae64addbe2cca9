"""vLLM backend (GPU only): a whole stage's requests in one `vllm.LLM.generate` call.

- Prompts are rendered with the tokenizer's chat template here (the same code as the `hf` backend) and
  passed as token prompts, so `GenResult.prompt_ids` are exactly what the engine saw.
- A request with `n` samples becomes `n` engine prompts with `n=1` and seed `sample_seed(seed, j)`, so
  completion j does not depend on `n` and matches the `hf` backend's seeding scheme; vLLM's prefix cache
  shares the prompt's KV blocks between them.
- `logprobs=0` returns the sampled token's log-prob only; the engine is built with
  `logprobs_mode="raw_logprobs"` (vLLM's default, pinned here): log-softmax of the raw logits, before
  temperature / top-p / the grammar mask, the same quantity the `hf` backend returns.
- `regex` becomes `SamplingParams(structured_outputs=StructuredOutputsParams(regex=...))` (vLLM >= 0.12
  names; xgrammar is vLLM's default structured-output backend).
- `use_adapter(path)` makes a new `LoRARequest(name, int_id, path)` with a new integer id every time, so a
  retrained adapter written to a new (or the same) directory is never served from vLLM's adapter cache.
"""

from __future__ import annotations

from configs.schema import ModelConfig
from engines.llm.base import Completion, GenRequest, GenResult, ProgressFn, sample_seed
from engines.llm.models import resolve_model


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
        self.path = resolve_model(cfg.name, cfg.cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {cfg.name!r} has no chat template; use an instruct/chat model")
        kwargs = dict(model=self.path, tokenizer=self.path, enable_lora=True, max_lora_rank=cfg.max_lora_rank,
                      tensor_parallel_size=cfg.tensor_parallel_size, max_model_len=cfg.max_model_len,
                      gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype,
                      logprobs_mode="raw_logprobs", seed=0)
        if cfg.data_parallel_size > 1:
            kwargs["data_parallel_size"] = cfg.data_parallel_size
        self.engine = vllm.LLM(**kwargs)

    def _params(self, req: GenRequest, j: int, room: int):
        from vllm import SamplingParams

        extra = {}
        if req.regex is not None:
            from vllm.sampling_params import StructuredOutputsParams

            extra["structured_outputs"] = StructuredOutputsParams(regex=req.regex)
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
        if path is None:
            self._lora, self.adapter = None, None
            return
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        self._lora = LoRARequest(f"adapter-{self._lora_ids}", self._lora_ids, str(path))
        self.adapter = str(path)

    def close(self) -> None:
        engine, self.engine = self.engine, None
        del engine
        try:
            import gc

            import torch

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:  # pragma: no cover
            pass


def _convert(out) -> Completion:
    """A vLLM `CompletionOutput` as our `Completion`."""
    token_ids = list(out.token_ids)
    logprobs = None
    if out.logprobs is not None:
        logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, out.logprobs)]
    reason = "length" if out.finish_reason == "length" else "stop"
    return Completion(text=out.text, token_ids=token_ids, logprobs=logprobs, finish_reason=reason)
