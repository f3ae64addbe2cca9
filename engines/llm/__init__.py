"""LLM backends behind one interface (`engines/llm/base.py`): `hf` (transformers) and `vllm`.

`load_llm(cfg)` picks the backend named by `cfg.backend`; vLLM is imported only when asked for, since it
exists only on CUDA machines.
"""

from __future__ import annotations

from sage.configs.schema import ModelConfig
from sage.engines.llm.base import LLM, Completion, GenRequest, GenResult, ProgressFn, Sleeps, sample_seed
from sage.engines.llm.models import ModelNotFoundError, resolve_model

__all__ = ["LLM", "Completion", "GenRequest", "GenResult", "ModelNotFoundError", "ProgressFn", "Sleeps", "load_llm",
           "resolve_model", "sample_seed"]


def load_llm(cfg: ModelConfig) -> LLM:
    """Build the backend `cfg.backend` for the model `cfg.name`."""
    if cfg.backend == "hf":
        from sage.engines.llm.hf import HFLLM

        return HFLLM(cfg)
    if cfg.backend == "vllm":
        from sage.engines.llm.vllm import VLLMLLM

        return VLLMLLM(cfg)
    raise ValueError(f"unknown model.backend {cfg.backend!r}; use 'hf' or 'vllm'")
