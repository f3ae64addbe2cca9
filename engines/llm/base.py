"""The one interface every LLM backend speaks: a batch of chat requests in, completions out.

A stage builds all its `GenRequest`s and hands them to `LLM.generate` in one call; the backend decides how
to batch. Results come back in request order, one `GenResult` per request with `n` completions each.

Log-probs (`Completion.logprobs`): for each sampled token, its log-probability under the *behaviour policy*
at that position, `log_softmax(raw_logits / T)[token]` with T the request's sampling temperature (1 for a
greedy request), before top-p truncation or the grammar mask. That is what a teacher-forced forward pass of
the same model (and adapter) at the same temperature gives for the same tokens, which is how the trainer
takes them (each row at its role's temperature), so it can use them as the behaviour policy's log-probs for
off-policy clipping. vLLM returns the same quantity with `logprobs_mode="processed_logprobs"` (what TRL's
own vLLM path uses), identical when top_p is 1; with top_p < 1 vLLM's includes the truncation, which a
teacher-forced pass cannot reproduce. The list has one entry per entry of `token_ids`, the final EOS included.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

ProgressFn = Callable[[int, int, int], None]  # (done_requests, total_requests, new_tokens_so_far)


@dataclass
class GenRequest:
    messages: list[dict]          # chat messages [{"role": "system"|"user"|"assistant", "content": str}]
    n: int = 1
    max_new_tokens: int = 256
    temperature: float = 1.0      # 0 => greedy
    top_p: float = 1.0
    seed: int = 0                 # completion j of this request uses a seed derived from (seed, j)
    regex: str | None = None      # constrain the completion to this regex (xgrammar) when set
    free: frozenset[int] = frozenset()  # indices of completions sampled without the regex (grammar annealing)

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError(f"GenRequest needs n >= 1 and max_new_tokens >= 1 (got n={self.n}, "
                             f"max_new_tokens={self.max_new_tokens})")
        if any(not 0 <= j < self.n for j in self.free):
            raise ValueError(f"GenRequest.free holds completion indices 0..{self.n - 1} (got {sorted(self.free)})")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"GenRequest needs temperature >= 0 and 0 < top_p <= 1 (got temperature="
                             f"{self.temperature}, top_p={self.top_p})")

    def regex_for(self, j: int) -> str | None:
        """The regex completion `j` is constrained to: None when there is none or `j` is in `free`."""
        return None if j in self.free else self.regex


@dataclass
class Completion:
    text: str                     # decoded completion, special tokens (the final EOS) left out
    token_ids: list[int]          # sampled tokens, the final EOS included when finish_reason == "stop"
    logprobs: list[float] | None  # per token of token_ids: log_softmax(logits / T)[token]; see module doc
    finish_reason: str            # "stop" (EOS, or the regex completed) | "length" (max_new_tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class GenResult:
    prompt_text: str
    prompt_ids: list[int]
    completions: list[Completion] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)


class LLM(Protocol):
    model_name: str
    adapter: str | None

    def generate(self, requests: list[GenRequest], progress: ProgressFn | None = None) -> list[GenResult]:
        """Complete every request (n samples each); results in request order."""

    def use_adapter(self, path: str | None) -> None:
        """Generate with the LoRA adapter saved at `path` from now on; None returns to the base model."""

    def close(self) -> None:
        """Free the model (and the GPU memory it holds)."""


@runtime_checkable
class Sleeps(Protocol):
    """A backend that can give its accelerator memory back between uses without being rebuilt (`vllm`).

    On one GPU, generation and training take turns: before the train stage the flow's `Engines.suspend` puts a
    backend that `Sleeps` to sleep, and closes one that does not (it is built again on next use). `sleep` frees
    the device memory the model holds (its weights go to CPU memory, its caches are dropped) and keeps the object:
    its adapter choice stays, and the next `generate` wakes it before generating, so a sleeping backend never
    generates. `use_adapter` may be called while it sleeps. Sleeping twice is one sleep.
    """

    def sleep(self) -> None:
        """Free the device memory until the next `generate`, which wakes the model first."""


def sample_seed(seed: int, index: int) -> int:
    """The 63-bit seed of completion `index` of a request with seed `seed` (stable across processes)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
