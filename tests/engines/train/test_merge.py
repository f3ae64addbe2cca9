"""Adapter merging for serving: the merged model computes what base + adapter computed, is saved in the base
model's own dtype with its tokenizer, and needs no peft to load."""

from __future__ import annotations

import json

from sage.engines.train.merge import merge_adapter


def _bf16_base_and_adapter(tiny_model, tmp_path):
    """The tiny model saved in bfloat16, and a LoRA adapter on it whose update is not zero."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "base-bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(base)
    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    return base, adapter


def test_merged_model_matches_base_plus_adapter_in_base_dtype(tiny_model, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, adapter = _bf16_base_and_adapter(tiny_model, tmp_path)
    out = tmp_path / "merged"
    merge_adapter(str(base), str(adapter), out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert (out / "tokenizer_config.json").is_file() and not (out / "adapter_config.json").exists()
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(input_ids=ids).logits
        expected = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                             adapter)(input_ids=ids).logits
    assert (merged - expected).abs().max() < 0.05  # only bf16 rounding of the merged weights
    # and the adapter changed something: the merge is not a copy of the base
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)(input_ids=ids).logits
    assert (expected - plain).abs().max() > 0.05


def test_no_adapter_writes_the_base_model(tiny_model, tmp_path):
    out = tmp_path / "copy"
    merge_adapter(str(tiny_model), None, out)
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == json.loads((tiny_model / "config.json").read_text())["dtype"]
    assert (out / "tokenizer_config.json").is_file() and (out / "model.safetensors").is_file()
