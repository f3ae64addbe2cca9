"""Merging a LoRA adapter into its base model, for serving without peft (`sage export --merge`).

The merge runs in float32, whatever the base's dtype, so the adapter's low-rank update is added at full
precision; the merged model is then saved in the base model's own dtype (bfloat16 or float16 when its config
says so, else float32) with the base's tokenizer, as a plain model directory that `from_pretrained` and
`vllm serve` load.
"""

from __future__ import annotations

import os

from sage.engines.llm.models import quiet_v6


def merge_adapter(base_path: str, adapter: str | None, out: str | os.PathLike) -> None:
    """Write base model `base_path` with `adapter` merged in (`merge_and_unload`), and its tokenizer, to the
    directory `out`. With `adapter` None the base model itself is written (a plain copy in its own dtype)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    saved_dtype = getattr(AutoConfig.from_pretrained(base_path), "dtype", None)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        with quiet_v6():
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    if isinstance(saved_dtype, torch.dtype) and saved_dtype in (torch.bfloat16, torch.float16):
        model = model.to(saved_dtype)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_path).save_pretrained(out)
