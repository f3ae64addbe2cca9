"""Generation throughput of the `hf` backend vs plain `transformers.generate`, next to a roofline.

    python bench/generation.py [--quick] [--model smollm2-135m-instruct] [--new-tokens 128]

For fp32 and bf16 and batch 1/8/32/64 it runs greedy decoding of the same chat prompts with plain
`model.generate` (left padding, dynamic cache) and with our decode loop (`HFLLM.generate`), and prints
tokens/s of each, their ratio, how many rows produced identical tokens, and % of a roofline measured in the
same run: per decode step, time >= max(2 * params * batch / matmul FLOP/s, (weight bytes + KV bytes read)
/ copy bandwidth). `--quick`: 64 new tokens, one repetition. Never run as a test.
"""

from __future__ import annotations

import argparse
import time

import torch

from configs.schema import ModelConfig
from engines.llm import GenRequest
from engines.llm.hf import HFLLM

TOPICS = ["7*8", "the sum of the first 20 odd numbers", "a function that reverses a string",
          "why the sky is blue", "12% of 250", "the derivative of x^3", "a prime greater than 100",
          "how to sort a list in Python"]


def measure_peaks(dtype: torch.dtype) -> tuple[float, float]:
    """(matmul FLOP/s in `dtype`, copy bandwidth bytes/s), best of a few tries."""
    a = torch.randn(1024, 1024, dtype=dtype)
    b = torch.randn(1024, 1024, dtype=dtype)
    flops = 0.0
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        flops = max(flops, 4 * 2 * 1024**3 / (time.perf_counter() - t))
    src = torch.empty(64 * 2**20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    bw = 0.0
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        bw = max(bw, 2 * src.numel() / (time.perf_counter() - t))
    return flops, bw


def roofline(model, batch: int, prompt_len: int, new: int, flops: float, bw: float) -> float:
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    elem = next(model.parameters()).element_size()
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * elem
    kv_bytes = batch * (prompt_len + new / 2) * kv_per_token
    step = max(2 * params * batch / flops, (params * elem + kv_bytes) / bw)
    return batch / step


def run(args) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, new tokens {args.new_tokens}, greedy")
    header = (f"{'dtype':>8} {'batch':>5} | {'plain tok/s':>11} {'ours tok/s':>10} {'speedup':>7} | "
              f"{'same rows':>9} | {'roofline':>8} {'plain %':>7} {'ours %':>6}")
    rows = []
    for dtype in args.dtypes:
        llm = HFLLM(ModelConfig(name=args.model, dtype=dtype, token_budget=1 << 20))
        flops, bw = measure_peaks(llm.dtype)
        print(f"{dtype}: matmul {flops / 1e9:.0f} GFLOP/s, copy bandwidth {bw / 1e9:.1f} GB/s")
        tok = llm.tokenizer
        tok.padding_side = "left"
        llm.generate([GenRequest([{"role": "user", "content": "hi"}], max_new_tokens=4, temperature=0)])
        for batch in args.batches:
            msgs = [[{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} (case {i})."}]
                    for i in range(batch)]
            reqs = [GenRequest(m, max_new_tokens=args.new_tokens, temperature=0) for m in msgs]
            enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True, padding=True)
            with torch.inference_mode():  # warm-up: oneDNN builds its kernels per shape on first use
                llm.generate([GenRequest(m, max_new_tokens=2, temperature=0) for m in msgs])
                llm.base.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=llm.pad_id)
            t = time.perf_counter()
            ours = llm.generate(reqs)
            t_ours = time.perf_counter() - t
            t = time.perf_counter()
            with torch.inference_mode():
                out = llm.base.generate(**enc, max_new_tokens=args.new_tokens, do_sample=False,
                                        eos_token_id=llm.eos_ids, pad_token_id=llm.pad_id)
            t_plain = time.perf_counter() - t
            gen = out[:, enc["input_ids"].shape[1]:].tolist()
            plain_tokens, same = 0, 0
            for g, res in zip(gen, ours):
                cut = next((k + 1 for k, x in enumerate(g) if x in llm.eos_ids), len(g))
                plain_tokens += cut
                same += g[:cut] == res.completions[0].token_ids
            ours_tokens = sum(len(r.completions[0].token_ids) for r in ours)
            plain_tps, ours_tps = plain_tokens / t_plain, ours_tokens / t_ours
            prompt_len = enc["input_ids"].shape[1]
            roof = roofline(llm.base, batch, prompt_len, args.new_tokens, flops, bw)
            rows.append(f"{dtype:>8} {batch:>5} | {plain_tps:>11.1f} {ours_tps:>10.1f} {ours_tps / plain_tps:>6.2f}x"
                        f" | {same:>4}/{batch:<4} | {roof:>8.0f} {100 * plain_tps / roof:>6.1f}% "
                        f"{100 * ours_tps / roof:>5.1f}%")
            print(rows[-1], flush=True)
        llm.close()
    print("\n" + header + "\n" + "-" * len(header) + "\n" + "\n".join(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--quick", action="store_true", help="64 new tokens instead of 128")
    args = p.parse_args()
    if args.quick:
        args.new_tokens = 64
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args)


if __name__ == "__main__":
    main()
