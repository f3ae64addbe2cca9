"""GPU check of the train step: a random-weight Qwen2 of 0.5B (or 7B) shape, bf16, LoRA r=128, 8 x 1024 tokens.

Runs our TRL step (`sage.engines.train.step.train_model`, the code path of `train_step` minus loading and saving) and
the plain PEFT loop of `bench/train.py` on the same batch, twice each (the first run of each is cold: CUDA/cuBLAS
warm-up), and prints time, tokens/s and peak memory. Nothing downloads: the model is built from a config, the
tokenizer is the tiny test one (only its pad id is used). Needs CUDA; one command, well under 10 minutes:

    .venv/bin/python bench/train_gpu.py                 # 0.5B shape (reference, plain PEFT on an H200: ~27k tok/s)
    .venv/bin/python bench/train_gpu.py --shape 7b      # 7B shape (reference: ~5.5k tok/s plain, ~8.6k via TRL)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPES = {  # Qwen2.5 shapes
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    # for a dry run of this script on a CPU (--shape tiny --device cpu)
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True),
}


def build_model(shape: str, device: str = "cuda", seed: int = 0):
    """Random-weight Qwen2 of the given shape, built directly on `device`; bf16 on CUDA, fp32 on CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                         bos_token_id=None, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(torch.bfloat16 if device.startswith("cuda") else torch.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--completion-len", type=int, default=768)
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--minibatch", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--no-checkpointing", action="store_true", help="disable gradient checkpointing")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain PEFT loop")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only for a dry run with --shape tiny")
    a = ap.parse_args(argv)

    import torch

    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("bench/train_gpu.py needs CUDA", file=sys.stderr)
        return 2

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def reset_peak():
        if cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_gib():
        return torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0

    from peft import get_peft_model
    from transformers import set_seed

    from bench.train import make_rows, plain_peft_step
    from sage.configs.schema import TrainConfig
    from sage.engines.llm.tiny import build_tokenizer
    from sage.engines.train.step import lora_config, train_model

    cfg = TrainConfig(lora_rank=a.rank, lora_alpha=2 * a.rank, lr=1e-6, minibatch_size=a.minibatch,
                      grad_accum=a.grad_accum, gradient_checkpointing=not a.no_checkpointing)
    tok_dir = Path(tempfile.mkdtemp(prefix="sage-gpu-tok-"))
    build_tokenizer().save_pretrained(tok_dir)
    t0 = time.perf_counter()
    model = build_model(a.shape, a.device)
    set_seed(0)
    model = get_peft_model(model, lora_config(cfg))
    n_params = sum(p.numel() for p in model.parameters())
    n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    rows = make_rows(a.rows, a.prompt_len, a.completion_len, model.config.vocab_size)
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    name = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    print(f"[gpu] {name} | Qwen2 {a.shape} shape, {n_params / 1e9:.2f}B params, LoRA r={a.rank} "
          f"({n_lora / 1e6:.1f}M trainable), {'bf16' if cuda else 'fp32'}, "
          f"checkpointing={cfg.gradient_checkpointing} | {a.rows} rows x "
          f"({a.prompt_len}+{a.completion_len}) = {tokens} tokens, minibatch {a.minibatch} x grad_accum "
          f"{a.grad_accum} | model built in {time.perf_counter() - t0:.1f} s", flush=True)

    results = {"shape": a.shape, "tokens": tokens, "rank": a.rank, "trl": [], "plain": []}
    for rep in range(2):
        reset_peak()
        sync()
        m = train_model(model, str(tok_dir), rows, cfg, seed=rep, device=a.device)
        sync()
        peak = peak_gib()
        results["trl"].append({"seconds": m["seconds"], "tokens_per_s": m["tokens_per_s"], "peak_gib": peak,
                               "loss": m["loss"], "grad_norm": m["grad_norm"]})
        print(f"[gpu] TRL train step ({'cold' if rep == 0 else 'warm'}): {m['seconds']:.3f} s, "
              f"{m['tokens_per_s']:,.0f} tokens/s, peak {peak:.1f} GiB, loss {m['loss']:.4g}, "
              f"grad_norm {m['grad_norm']:.4g}", flush=True)
        if not a.no_plain:
            reset_peak()
            p = plain_peft_step(model, rows, cfg, device=a.device, pad_id=0, bf16_autocast=cuda)
            peak = peak_gib()
            results["plain"].append({**p, "peak_gib": peak})
            print(f"[gpu] plain PEFT loop ({'cold' if rep == 0 else 'warm'}): {p['seconds']:.3f} s, "
                  f"{p['tokens_per_s']:,.0f} tokens/s, peak {peak:.1f} GiB", flush=True)
    trl_tps = results["trl"][-1]["tokens_per_s"]
    line = f"[gpu] result: train step {results['trl'][-1]['seconds']:.3f} s, {trl_tps:,.0f} tokens/s"
    if results["plain"]:
        ratio = trl_tps / results["plain"][-1]["tokens_per_s"]
        results["ratio"] = ratio
        line += f"; plain PEFT {results['plain'][-1]['tokens_per_s']:,.0f} tokens/s; ratio {ratio:.2f}"
    print(line, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
