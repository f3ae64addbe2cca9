"""Generation throughput of the `hf` backend vs plain `transformers.generate`, next to a roofline.

    python bench/generation.py [--quick] [--sampled] [--repeat 2] [--batches 1 8 32 64] [--new-tokens 128]
    python bench/generation.py --breakdown [--dtypes bfloat16]

For fp32 and bf16 and batch 1/8/32/64 it runs greedy decoding of the same chat prompts with plain
`model.generate` (left padding, dynamic cache) and with our decode loop (`HFLLM.generate`), and prints
tokens/s of each (best of `--repeat` interleaved runs: other processes on a small machine make single runs
noisy), their ratio, how many rows produced identical tokens, and % of a roofline measured in the same run:
per decode step, time >= max(2 * params * batch / matmul FLOP/s, (weight bytes + KV bytes read) / copy
bandwidth). `--sampled` adds our tokens/s at temperature 1 (the pipeline's setting). `--quick`: 64 new
tokens, one run each. `--breakdown`: where a decode step of our backend spends its time, by operator (torch's
profiler). Never run as a test.
"""

from __future__ import annotations

import argparse
import time

import sage  # noqa: F401  (first: its OpenMP settings must be in place before torch starts)

# isort: split
import torch

from sage.configs.schema import ModelConfig
from sage.engines.llm import GenRequest
from sage.engines.llm.hf import HFLLM

TOPICS = ["7*8", "the sum of the first 20 odd numbers", "a function that reverses a string",
          "why the sky is blue", "12% of 250", "the derivative of x^3", "a prime greater than 100",
          "how to sort a list in Python"]


def measure_peaks(dtype: torch.dtype) -> tuple[float, float]:
    """(matmul FLOP/s in `dtype`, copy bandwidth bytes/s), best of a few tries."""
    a = torch.randn(1024, 1024, dtype=dtype)
    b = torch.randn(1024, 1024, dtype=dtype)
    a @ b  # warm-up: the first call builds the kernel
    flops = 0.0
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(16):
            a @ b
        flops = max(flops, 16 * 2 * 1024**3 / (time.perf_counter() - t))
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


def best_of(repeat: int, fns: dict):
    """{name: (best seconds, last result)}, the functions run interleaved so load from other processes hits
    all of them alike."""
    best = {name: (float("inf"), None) for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.perf_counter()
            out = fn()
            best[name] = (min(best[name][0], time.perf_counter() - t), out)
    return best


def measure(llm: HFLLM, batch: int, args, flops: float, bw: float) -> str:
    """One table row: greedy tokens/s of plain `generate` and of ours (and ours sampled) at this batch."""
    msgs = [[{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} (case {i})."}] for i in range(batch)]
    reqs = [GenRequest(m, max_new_tokens=args.new_tokens, temperature=0) for m in msgs]
    sampled = [GenRequest(m, max_new_tokens=args.new_tokens, temperature=1.0, seed=i) for i, m in enumerate(msgs)]
    enc = llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True, padding=True)

    def plain(new: int = args.new_tokens):
        with torch.inference_mode():
            return llm.base.generate(**enc, max_new_tokens=new, do_sample=False, eos_token_id=llm.eos_ids,
                                     pad_token_id=llm.pad_id)

    llm.generate([GenRequest(m, max_new_tokens=2, temperature=0) for m in msgs])  # warm-up: oneDNN builds
    plain(2)  # its kernels per shape on first use
    fns = {"ours": lambda: llm.generate(reqs), "plain": plain}
    if args.sampled:
        fns["sampled"] = lambda: llm.generate(sampled)
    best = best_of(args.repeat, fns)
    gen = best["plain"][1][:, enc["input_ids"].shape[1]:].tolist()
    plain_tokens, same = 0, 0
    for g, res in zip(gen, best["ours"][1]):
        cut = next((k + 1 for k, x in enumerate(g) if x in llm.eos_ids), len(g))
        plain_tokens += cut
        same += g[:cut] == res.completions[0].token_ids
    count = {name: sum(len(r.completions[0].token_ids) for r in best[name][1]) for name in ("ours", "sampled")
             if name in best}
    plain_tps, ours_tps = plain_tokens / best["plain"][0], count["ours"] / best["ours"][0]
    roof = roofline(llm.base, batch, enc["input_ids"].shape[1], args.new_tokens, flops, bw)
    row = (f"{args.dtype:>8} {batch:>5} | {plain_tps:>11.1f} {ours_tps:>10.1f} {ours_tps / plain_tps:>6.2f}x"
           f" | {same:>4}/{batch:<4} | {roof:>8.0f} {100 * plain_tps / roof:>6.1f}% {100 * ours_tps / roof:>5.1f}%")
    if args.sampled:
        row += f" | {count['sampled'] / best['sampled'][0]:>10.1f}"
    return row


# The parts of a decode step, by operator name (aten and oneDNN): what is left is other per-element work (the
# rotary embedding, residual adds, copies, indexing).
PARTS = {"matmuls": {"mm", "addmm", "addmm_", "linear", "matmul", "bmm", "_linear_pointwise"},
         "attention": {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                       "_scaled_dot_product_attention_math", "_scaled_dot_product_efficient_attention"},
         "RMSNorm": {"rms_norm", "_fused_rms_norm"},
         "activation": {"silu", "silu_", "gelu"},
         "token choice": {"argmax", "max", "topk", "sort", "softmax", "_softmax", "log_softmax", "_log_softmax",
                          "multinomial"}}


def profile(llm: HFLLM, requests: list[GenRequest]) -> tuple[float, dict[str, float], int]:
    """(wall seconds, operator self time in seconds per part of PARTS and "other operators", completion tokens)
    of one `generate` call under torch's profiler."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    spent = dict.fromkeys([*PARTS, "other operators"], 0.0)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        results = llm.generate(requests)
        wall = time.perf_counter() - start
    for event in prof.key_averages():
        op = event.key.split("::")[-1]
        part = next((name for name, ops in PARTS.items() if op in ops), "other operators")
        spent[part] += event.self_cpu_time_total / 1e6
    return wall, spent, sum(len(r.completions[0].token_ids) for r in results)


def breakdown(args, batch: int = 64, steps: int = 100, warm: int = 5) -> None:
    """Where a decode step of the `hf` backend spends its time: torch's profiler over two greedy `generate` calls
    of the same `batch` prompts, `warm` and `warm + steps` new tokens; their difference is `steps` decode steps
    (the prefill and the first steps cancel), split by the operators' self time into PARTS, other operators,
    and the time outside any operator (Python, the decode loop)."""
    llm = HFLLM(ModelConfig(name=args.model, dtype=args.dtypes[-1], token_budget=1 << 20))
    msgs = [[{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} (case {i})."}] for i in range(batch)]
    llm.generate([GenRequest(m, max_new_tokens=2, temperature=0) for m in msgs])  # warm-up: oneDNN builds kernels
    short = profile(llm, [GenRequest(m, max_new_tokens=warm, temperature=0) for m in msgs])
    long = profile(llm, [GenRequest(m, max_new_tokens=warm + steps, temperature=0) for m in msgs])
    total = long[0] - short[0]
    spent = {part: long[1][part] - short[1][part] for part in long[1]}
    full = long[2] - short[2] == batch * steps
    print(f"{llm.dtype}, batch {batch}, {steps} decode steps after {warm}: {1e3 * total / steps:.1f} ms per decode "
          f"step" + ("" if full else f" ({long[2] - short[2]} of {batch * steps} tokens: rows ended early)"))
    for name, sec in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<16} {1e3 * sec / steps:6.1f} ms")
    print(f"  {'outside operators':<16} {1e3 * (total - sum(spent.values())) / steps:6.1f} ms")


def run(args) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, new tokens {args.new_tokens}, greedy, "
          f"best of {args.repeat}")
    header = (f"{'dtype':>8} {'batch':>5} | {'plain tok/s':>11} {'ours tok/s':>10} {'speedup':>7} | "
              f"{'same rows':>9} | {'roofline':>8} {'plain %':>7} {'ours %':>6}")
    header += f" | {'ours T=1':>10}" if args.sampled else ""
    rows = []
    for dtype in args.dtypes:
        llm = HFLLM(ModelConfig(name=args.model, dtype=dtype, token_budget=1 << 20))
        args.dtype = dtype
        flops, bw = measure_peaks(llm.dtype)
        print(f"{dtype}: matmul {flops / 1e9:.0f} GFLOP/s, copy bandwidth {bw / 1e9:.1f} GB/s")
        llm.tokenizer.padding_side = "left"
        for batch in args.batches:
            rows.append(measure(llm, batch, args, flops, bw))
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
    p.add_argument("--repeat", type=int, default=2, help="runs of each measurement, best kept (interleaved)")
    p.add_argument("--sampled", action="store_true", help="also time our backend sampling at temperature 1")
    p.add_argument("--quick", action="store_true", help="64 new tokens, one run each")
    p.add_argument("--breakdown", action="store_true",
                   help="instead: time the parts of a batch-64 decode step of our backend (last of --dtypes)")
    args = p.parse_args()
    if args.quick:
        args.new_tokens, args.repeat = 64, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    breakdown(args) if args.breakdown else run(args)


if __name__ == "__main__":
    main()
