"""Generation with a LoRA adapter vs without: the `hf` backend on the same requests, base model and adapter.

    python -m bench.adapter_generation [--rows 24] [--samples 1] [--new-tokens 96] [--kind solver_math] [--repeat 3]
        [--rounds 1] [--revision REV]

Iterations after the first generate with the previous iteration's adapter, so this is the cost every later
iteration pays. The model is `cpu.yaml`'s (SmolLM2-135M, bf16 on a CPU with bf16 support); the adapter has its
shape (rank 16, alpha 32, every linear layer) as PEFT initialises it (B = 0): its matmuls cost what a trained
adapter's do, and the tokens are exactly the base model's, so both runs decode the same sequences.
The prompts are the pipeline's own (`--kind`: the Solver's by default, its worked example included, as
validation and the solve stage send them; or the Critic's or the Planner's), greedy by default as validation
decodes (`--temperature` to sample), so prefill and decode both count as they do in a stage. It prints the
wall time of the whole generation and of the prefill alone (`max_new_tokens` 1), best of `--repeat`
interleaved runs in one process (and of `--rounds` processes), and the adapter's ratio to the base model.
`--samples N` asks N completions of each request (the solve stage asks `iteration.n_solve`; sample at a
temperature then, or the N are the same). `--revision REV` measures REV's files the same way, in alternating
processes, to compare a change with the code before it. Never run as a test.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.startup import ROOT, tree_of

QUESTIONS = ["What is 7 * 8?", "Find the sum of the first 20 odd numbers.", "What is 12% of 250?",
             "Solve x + 7 = 19 for x.", "What is the greatest common divisor of 18 and 24?",
             "Write a function `rev(s)` that reverses a string.", "What is the derivative of x^3?",
             "Name a prime greater than 100.", "Compute 3 + 4 + 5.", "What is the least common multiple of 4 and 6?",
             "Write a function `is_even(n)` returning whether n is even.", "How many minutes are in 3 hours?"]


def child(args) -> dict:
    """One fresh process: build the backend and the adapter, time base and adapter generation."""
    import sage  # noqa: F401  (first: its OpenMP settings must be in place before torch starts)
    # isort: split
    import torch
    from peft import LoraConfig, get_peft_model

    from sage.configs import load_config
    from sage.engines.llm import GenRequest
    from sage.engines.llm.hf import HFLLM
    from sage.stages.prompts import field_limit, render

    cfg = load_config("cpu")
    llm = HFLLM(cfg.model)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        # PEFT's initialisation, B = 0: the samples are exactly the base model's, so both runs decode the same
        # tokens, and the adapter's matmuls cost what a trained adapter's do
        lora = LoraConfig(r=cfg.train.lora_rank, lora_alpha=cfg.train.lora_alpha, target_modules="all-linear")
        peft = get_peft_model(copy.deepcopy(llm.base), lora)
        peft.save_pretrained(tmp)
        del peft
        limit = field_limit(args.kind, llm.tokenizer, cfg.model.max_model_len, args.new_tokens)
        prompts = [render(args.kind, limit, question=QUESTIONS[k % len(QUESTIONS)] + f" (case {k})")
                   for k in range(args.rows)]

        def timed(adapter: str | None, new_tokens: int) -> tuple[float, int]:
            llm.use_adapter(adapter)
            reqs = [GenRequest(p, n=args.samples, max_new_tokens=new_tokens, temperature=args.temperature, seed=k)
                    for k, p in enumerate(prompts)]
            t = time.perf_counter()
            out = llm.generate(reqs)
            seconds = time.perf_counter() - t
            res["prompt_tokens"] = sum(len(r.prompt_ids) for r in out)
            res[f"{'adapter' if adapter else 'base'}_steps"] = max(len(c.token_ids) for r in out for c in r.completions)
            return seconds, sum(len(c.token_ids) for r in out for c in r.completions)

        res = {}
        timed(None, 4), timed(tmp, 4)  # warm-up: kernels, the adapter's first load
        for _ in range(args.repeat):  # interleaved, best kept
            for name, adapter in (("base", None), ("adapter", tmp)):
                for part, new in (("prefill", 1), ("total", args.new_tokens)):
                    seconds, res[f"{name}_{part}_tokens"] = timed(adapter, new)
                    res[f"{name}_{part}_s"] = min(seconds, res.get(f"{name}_{part}_s", seconds))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=24, help="requests (one completion each)")
    ap.add_argument("--samples", type=int, default=1, help="completions per request")
    ap.add_argument("--new-tokens", type=int, default=96, help="most new tokens per completion")
    ap.add_argument("--kind", default="solver_math", choices=["solver_math", "critic_question", "planner"],
                    help="the pipeline prompt the requests use")
    ap.add_argument("--repeat", type=int, default=3, help="measurements of each in one process, best kept")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy, as validation decodes; above 0 the stages' sampling")
    ap.add_argument("--rounds", type=int, default=1, help="fresh processes of each code, best kept")
    ap.add_argument("--revision", help="git revision to compare with (e.g. the commit before a change)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"now": None}
        if args.revision:
            trees[args.revision] = tree_of(args.revision, Path(tmp) / "rev")
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                env = dict(os.environ, **({"PYTHONPATH": f"{tree}:{ROOT}"} if tree else {}))
                cmd = [sys.executable, "-m", "bench.adapter_generation", "--child", "--rows", str(args.rows),
                       "--samples", str(args.samples),
                       "--new-tokens", str(args.new_tokens), "--kind", args.kind, "--repeat", str(args.repeat),
                       "--temperature", str(args.temperature)]
                r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT if tree is None else tmp)
                if r.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{r.stderr[-3000:]}")
                got = json.loads(r.stdout.strip().splitlines()[-1])
                keep = best.setdefault(name, got)
                for k, v in got.items():
                    if k.endswith("_s"):
                        keep[k] = min(keep[k], v)
    load = os.getloadavg()
    now = best["now"]
    print(f"{args.rows} rows x {args.samples} samples, {now['prompt_tokens']} prompt tokens, "
          f"up to {args.new_tokens} new each "
          f"(completion tokens: base {now['base_total_tokens']}, adapter {now['adapter_total_tokens']}); "
          f"best of {args.repeat} x {args.rounds} (load average {load[0]:.1f} {load[1]:.1f})")
    print("ms per: prefill, a prompt token; total, a completion token; decode (total - prefill), a step (the longest "
          "completion's tokens)")
    print(f"{'code':>10} {'part':>8} {'base s':>8} {'adapter s':>10} {'ratio':>6} {'base ms per':>12} "
          f"{'adapter ms per':>15} {'ratio':>6}")
    for name, r in best.items():
        for part in ("prefill", "total", "decode"):
            if part == "decode":
                b, a = (r[f"{k}_total_s"] - r[f"{k}_prefill_s"] for k in ("base", "adapter"))
                tb, ta = r["base_steps"], r["adapter_steps"]
            else:
                b, a = r[f"base_{part}_s"], r[f"adapter_{part}_s"]
                tb, ta = ((r["prompt_tokens"],) * 2 if part == "prefill"
                          else (r[f"base_{part}_tokens"], r[f"adapter_{part}_tokens"]))
            print(f"{name:>10} {part:>8} {b:8.2f} {a:10.2f} {a / b:6.2f}x {1e3 * b / tb:12.2f} {1e3 * a / ta:15.2f} "
                  f"{(a / ta) / (b / tb):6.2f}x")


if __name__ == "__main__":
    main()
