"""Train-step throughput: our TRL `GRPOTrainer` subclass vs a plain PEFT forward/backward/step loop.

Both train the same fresh LoRA (same seed, same config) on the same stored batch with the same policy-gradient
loss (token-level `dapo` mean over each update's completion tokens), the same rows in each AdamW update
(`minibatch_size` x `grad_accum`; ours cuts the update into micro-batches by length, the plain loop in sampler
order), the same gradient clipping. Tokens/s counts prompt + completion tokens of the rows; time is the training
loop only (model loading excluded). Goal: ratio (TRL / plain) >= 0.9; `python -m bench.train_check` holds the
trainer to a stated lead over the plain loop.

Both take pi_old as the train stage does on the hf backend: the random rows carry the sampling log-probs the hf
backend would have stored for them (the fresh adapter's, scored before timing), and they are pi_old of TRL's
clipped ratio in every update, so the second update weighs its rows against the policy that drew them. With
`--old-policy sampler` (the default; what `auto` is on the hf backend, `cpu.yaml`) ours recomputes nothing;
`--old-policy recompute` (vLLM's) has ours score pi_old of the later updates' rows before the first update and
importance-weigh every token against the stored log-probs (`trainer`), while the plain loop keeps the stored ones.

    .venv/bin/python bench/train.py                 # SmolLM2-135M on CPU (falls back to a random mid-size Llama)
    .venv/bin/python bench/train.py --model random  # the random Llama explicitly
    # the shape an iteration of cpu.yaml trains (bf16, 32 rows of ~350 prompt + ~100 completion tokens):
    .venv/bin/python bench/train.py --dtype bf16 --rows 32 --minibatch 8 --grad-accum 1 \
        --prompt-len 450 --prompt-jitter 0.45 --completion-len 150 --jitter 0.7 --peak-rss

`--peak-rss` also runs one pass of each loop in a fresh process and reports its peak resident memory
(`VmHWM`: `ru_maxrss` would report this parent's peak, which a child keeps across fork and exec) and its
resident memory once the model is loaded, before the pass.

`--from-run DIR [--iteration K] [--set section.field=value]` trains on the rows a `sage run` project stored for
iteration K instead of random ones (`--rows N`: the first N of them), in the order the train stage would. The
`--set` overrides must be the run's own where they choose rows or their temperatures (`train.roles`,
`roles.<role>.temperature`), and K should be 1: the rows carry the sampling log-probs of the policy that drew
them, and a later iteration's were drawn with an adapter this fresh one is not. For example, the Solver-only
rows of the learning experiment's lever 5 (DIR: its `bench.learning --out`):

    .venv/bin/python bench/train.py --dtype bf16 --minibatch 1 --grad-accum 8 --repeats 1 \
        --from-run DIR --iteration 1 --set 'train.roles=[solver]' --set roles.solver.temperature=0.7 --rows 32

`--head TOKENS` times the LM head alone (log-probs and entropy, forward and backward) through TRL's kernel and
through ours. `plain_peft_step` is also used by `bench/train_gpu.py`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sage.configs.schema import TrainConfig  # noqa: E402
from sage.engines.llm.models import quiet_v6  # noqa: E402
from sage.engines.train.rows import TrainRow  # noqa: E402
from sage.engines.train.step import load_policy, resolve_device, train_model  # noqa: E402


def make_rows(n: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0,
              jitter: float = 0.0, prompt_jitter: float = 0.0) -> list[TrainRow]:
    """Random stored rollouts; `jitter` (`prompt_jitter`) shortens each completion (prompt) by a random fraction
    of up to that much of its length, as rows of different roles and answers differ (padding)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        c = max(1, completion_len - int(rng.random() * jitter * completion_len))
        p = max(1, prompt_len - int(rng.random() * prompt_jitter * prompt_len))
        rows.append(TrainRow(prompt_ids=[rng.randrange(3, vocab) for _ in range(p)],
                             completion_ids=[rng.randrange(3, vocab) for _ in range(c)],
                             advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.5),
                             role=("challenger", "planner", "solver", "critic")[i % 4]))
    return rows


def sampling_logprobs(model, rows: list[TrainRow], device: str = "cpu") -> list[TrainRow]:
    """`rows` carrying what the hf backend stores as their sampling log-probs under `model` (the policy that would
    have generated them): log_softmax(logits / temperature) of each completion token, float32 logits of a plain
    forward pass, one row at a time."""
    import dataclasses

    import torch

    model.to(device).eval()
    out = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([r.prompt_ids + r.completion_ids], device=device)
            c = len(r.completion_ids)
            logits = model(input_ids=ids, logits_to_keep=c + 1).logits[0, :-1].float() / r.temperature
            targets = torch.tensor(r.completion_ids, device=device)[:, None]
            logprobs = logits.gather(-1, targets)[:, 0] - torch.logsumexp(logits, dim=-1)
            out.append(dataclasses.replace(r, logprobs=logprobs.tolist()))
    return out


def run_rows(run_dir: str, iteration: int, overrides: list[str]) -> list[TrainRow]:
    """The training rows a `sage run` project stored for `iteration` (`cpu` config with `overrides`), with a
    completion, in the order the train stage reads them."""
    from sage.configs import load_config
    from sage.stages.train import stored_rows
    from sage.warehouse import Warehouse

    cfg = load_config("cpu", overrides)
    wh = Warehouse(f"{run_dir}/warehouse.duckdb", read_only=True)
    run_id = wh.rows("SELECT run_id FROM runs ORDER BY created_at LIMIT 1")[0]["run_id"]
    return [r for r in stored_rows(wh, cfg, run_id, iteration) if r.completion_ids]


def _pad_batch(rows: list[TrainRow], pad_id: int, device):
    """Left-padded prompts + right-padded completions, exactly the layout our trainer feeds TRL, with each row's
    advantage, sampling temperature and stored log-probs (None unless every row stores them)."""
    import torch

    p_len = max(len(r.prompt_ids) for r in rows)
    c_len = max(len(r.completion_ids) for r in rows)
    ids = torch.full((len(rows), p_len + c_len), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    cmask = torch.zeros((len(rows), c_len), dtype=torch.float32)
    old = torch.zeros((len(rows), c_len), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        ids[i, p_len - p:p_len] = torch.tensor(r.prompt_ids)
        ids[i, p_len:p_len + c] = torch.tensor(r.completion_ids)
        attn[i, p_len - p:p_len + c] = 1
        cmask[i, :c] = 1
        if r.logprobs is not None:
            old[i, :c] = torch.tensor(r.logprobs, dtype=torch.float32)
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    temps = torch.tensor([r.temperature for r in rows], dtype=torch.float32)
    old = old.to(device) if all(r.logprobs is not None for r in rows) else None
    return ids.to(device), attn.to(device), cmask.to(device), adv.to(device), temps.to(device), old, c_len


def plain_peft_step(model, rows: list[TrainRow], cfg: TrainConfig, *, device: str = "cpu", pad_id: int = 0,
                    bf16_autocast: bool = False) -> dict:
    """One pass over `rows` with a hand-written loop: forward, log-softmax, PG loss, backward, clip, AdamW.

    The loss is the trainer's: TRL's clipped objective -min(r A, clip(r, 1 - clip_eps_low, 1 + clip_eps_high) A)
    of each completion token, r = pi / pi_old at the row's temperature, summed over the update's completion tokens
    and divided by their number (`dapo`, `token_mean`). pi_old is the rows' stored sampling log-probs, as the
    train stage takes them on the hf backend, so a later update's rows are weighed against the policy that drew
    them; rows without stored log-probs take the current policy, detached (r = 1, gradient -A grad log pi)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    model.to(device)
    model.train()
    if cfg.gradient_checkpointing:
        with quiet_v6():
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
    block = cfg.minibatch_size * cfg.grad_accum
    losses, norms = [], []
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    for start in range(0, len(rows), block):
        update = rows[start:start + block]
        n_tokens = sum(len(r.completion_ids) for r in update)
        total = 0.0
        for m in range(0, len(update), cfg.minibatch_size):
            ids, attn, cmask, adv, temps, old, c_len = _pad_batch(update[m:m + cfg.minibatch_size], pad_id, device)
            with torch.autocast(device_type="cuda" if str(device).startswith("cuda") else "cpu",
                                dtype=torch.bfloat16, enabled=bf16_autocast):
                logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=c_len + 1).logits[:, :-1]
            logits = logits.float()
            if bool((temps != 1).any()):  # at temperature 1, no division over the whole vocabulary
                logits = logits / temps[:, None, None]
            logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -c_len:, None])[..., 0]
            ratio = torch.exp(logp - (logp.detach() if old is None else old))
            clipped = torch.clamp(ratio, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
            per_token = -torch.min(ratio * adv[:, None], clipped * adv[:, None])
            loss = (per_token * cmask).sum() / n_tokens
            loss.backward()
            total += float(loss.detach())
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    sync()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "n_updates": len(losses),
            "loss": sum(losses) / len(losses), "grad_norm": sum(norms) / len(norms), "grad_norms": norms}


def head_pass(kernel: str, hidden, weight, targets, temperature: float = 0.7) -> tuple[float, float]:
    """One forward + backward of the LM head alone, as the trainer calls it (log-probs and the entropy TRL logs):
    `kernel` "trl" (TRL's `ChunkedLogProbFunction`) or "ours" (`token_chunked_logprobs`). (CPU s, grad norm)."""
    import torch

    from sage.engines.train.logprobs import token_chunked_logprobs, trl_chunked_logprobs

    h = hidden.detach().clone().requires_grad_()
    c0 = time.process_time()
    if kernel == "trl":
        lp, _ = trl_chunked_logprobs(h, weight, None, targets, temperature, entropy=True)
    else:
        lp, _ = token_chunked_logprobs(h, weight, None, targets, temperature, entropy=True)
    (lp * torch.linspace(-1, 1, lp.numel())).sum().backward()
    return time.process_time() - c0, float(h.grad.float().norm())


def trl_row_order(rows: list[TrainRow], seed: int = 0) -> list[TrainRow]:
    """The order our trainer's sampler visits rows in (its seeded permutation), so both loops see the same
    updates."""
    from sage.engines.train.trainer import BlockRepeatSampler

    order = BlockRepeatSampler(n_rows=len(rows), block=len(rows), repeats=1, dummy=-1, shuffle=True, seed=seed)
    return [rows[i] for i in order if i >= 0]


def random_llama(out_dir: Path) -> Path:
    """A mid-size random Llama (about 30M parameters) + the tiny test tokenizer, when SmolLM2 is unavailable."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sage.engines.llm.tiny import build_tokenizer

    if (out_dir / "config.json").exists():
        return out_dir
    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                         bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def pick_model(name: str) -> tuple[str, str]:
    if name != "random":
        try:
            from sage.configs.schema import ModelConfig
            from sage.engines.llm.models import resolve_model

            return resolve_model(name, ModelConfig().cache_dir), name
        except Exception as exc:  # any failure: fall back, and say so
            print(f"[bench] {name} unavailable ({type(exc).__name__}: {exc}); using a random mid-size Llama",
                  file=sys.stderr)
    path = random_llama(Path(tempfile.gettempdir()) / "sage-bench-llama-30m")
    return str(path), "random-llama-30m (hidden 512, 8 layers, vocab 8192)"


def rss_mb() -> float:
    """Resident memory of this process now, MiB."""
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    """Peak resident memory of this process image, MiB (`VmHWM`, which starts afresh at exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def _one_pass(loop: str, path: str, rows: list[TrainRow], cfg: TrainConfig, device: str, dtype, pad_id: int) -> dict:
    """Load a fresh policy and run one pass of `loop` ("plain" or "trl") over `rows`."""
    model = load_policy(path, None, cfg, seed=0, dtype=dtype)
    loaded_mb = rss_mb()
    if loop == "plain":
        out = plain_peft_step(model, trl_row_order(rows), cfg, device=device, pad_id=pad_id)
    else:
        t0 = time.perf_counter()
        out = train_model(model, path, rows, cfg, seed=0, device=device)
        out["wall_seconds"] = time.perf_counter() - t0  # with building the trainer (tokenizer, TRL setup)
        out["wall_tokens_per_s"] = out["tokens"] / out["wall_seconds"]
    out["rss_loaded_mb"] = loaded_mb
    return out


def _peak_rss(loop: str, argv: list[str]) -> dict:
    """One pass of `loop` in a fresh process: its peak resident memory and its memory once loaded."""
    import subprocess

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, __file__, *argv, "--only", loop, "--json", f.name], check=True,
                       stdout=subprocess.DEVNULL)
        return json.loads(Path(f.name).read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model name for resolve_model, or 'random'")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=96)
    ap.add_argument("--jitter", type=float, default=0.0, help="vary completion lengths by up to this fraction")
    ap.add_argument("--prompt-jitter", type=float, default=0.0, help="vary prompt lengths by up to this fraction")
    ap.add_argument("--minibatch", type=int, default=2)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", default="fp32", help="base model dtype: fp32, bf16 or auto (LoRA stays fp32)")
    ap.add_argument("--repeats", type=int, default=3, help="alternate plain/TRL this many times; best of each")
    ap.add_argument("--peak-rss", action="store_true", help="also measure each loop's peak RSS in a fresh process")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="instead: one pass of our trainer under torch.profiler; print its N costliest operators")
    ap.add_argument("--head", type=int, default=0, metavar="TOKENS",
                    help="instead: the LM head alone (forward + backward) on TOKENS tokens, TRL's kernel vs ours")
    ap.add_argument("--from-run", default=None, metavar="DIR", help="train on this sage run's stored rows")
    ap.add_argument("--iteration", type=int, default=1, help="with --from-run: whose rows")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="with --from-run: config overrides that choose the rows (train.roles, ...)")
    ap.add_argument("--only", choices=("plain", "trl"), default=None,
                    help="run this loop alone and print its result as JSON (what --peak-rss runs in a child)")
    ap.add_argument("--old-policy", choices=("sampler", "recompute"), default="sampler",
                    help="train.old_policy: sampler (the hf backend's, cpu.yaml) or recompute (vLLM's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoTokenizer

    from sage.engines.llm.models import resolve_dtype

    device = resolve_device(a.device)
    dtype = resolve_dtype(a.dtype, device)
    path, label = pick_model(a.model)
    vocab = AutoConfig.from_pretrained(path).vocab_size
    pad_id = AutoTokenizer.from_pretrained(path).pad_token_id or 0
    cfg = TrainConfig(lora_rank=a.rank, lora_alpha=2 * a.rank, lr=1e-5, minibatch_size=a.minibatch,
                      grad_accum=a.grad_accum, loss_weighting="token_mean",  # the plain loop's token mean
                      old_policy=a.old_policy)  # as the train stage resolves auto on hf (sampler) or vLLM
    if a.from_run:
        rows = run_rows(a.from_run, a.iteration, a.overrides)[:a.rows or None]
    else:  # as stored by the hf backend: with the generating policy's log-probs (the fresh adapter each pass starts)
        rows = make_rows(a.rows, a.prompt_len, a.completion_len, vocab, jitter=a.jitter,
                         prompt_jitter=a.prompt_jitter)
        if not a.head:
            rows = sampling_logprobs(load_policy(path, None, cfg, seed=0, dtype=dtype), rows, device)
    if a.head:
        weight = load_policy(path, None, cfg, seed=0, dtype=dtype).get_output_embeddings().weight.detach()
        g = torch.Generator().manual_seed(0)
        hidden = torch.randn(a.head, weight.size(1), generator=g).to(weight.dtype)
        targets = torch.randint(0, weight.size(0), (a.head,), generator=g)
        best = {k: min(head_pass(k, hidden, weight, targets) for _ in range(a.repeats)) for k in ("trl", "ours")}
        print(f"[bench] LM head, {a.head} tokens x {weight.size(0)} words, {str(weight.dtype).removeprefix('torch.')}: "
              f"TRL {best['trl'][0] * 1e3:.0f} ms, ours {best['ours'][0] * 1e3:.0f} ms (CPU, best of {a.repeats}; "
              f"{best['trl'][0] / best['ours'][0]:.2f}x), gradient norms {best['trl'][1]:.6g} and "
              f"{best['ours'][1]:.6g}")
        return 0
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _one_pass("trl", path, rows, cfg, device, dtype, pad_id)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.profile))
        return 0
    if a.only:
        out = _one_pass(a.only, path, rows, cfg, device, dtype, pad_id)
        out["peakrss_mb"] = _peak_mb()
        out.pop("steps", None)
        text = json.dumps(out)
        print(text)
        if a.json:
            Path(a.json).write_text(text)
        return 0
    n_tok = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    shape = (f"stored rows of {a.from_run} iteration {a.iteration}" if a.from_run else
             f"prompt {a.prompt_len} -{a.prompt_jitter:.0%}, completion {a.completion_len} -{a.jitter:.0%}")
    print(f"[bench] model={label} device={device} dtype={str(dtype).removeprefix('torch.')} "
          f"threads={torch.get_num_threads()} rows={len(rows)} tokens={n_tok} ({shape}) minibatch={a.minibatch} "
          f"grad_accum={a.grad_accum} lora_r={a.rank} old_policy={a.old_policy}", flush=True)

    def report(rep: int, label: str, r: dict, extra: str = "") -> None:
        print(f"[bench] rep {rep} {label}: {r['seconds']:.2f} s (cpu {r['cpu_seconds']:.2f} s), "
              f"{r['tokens_per_s']:.0f} tok/s{extra}, loss {r['loss']:.4f}, grad_norm {r['grad_norm']:.4f}", flush=True)

    plain_runs, trl_runs = [], []
    for rep in range(a.repeats):
        plain = _one_pass("plain", path, rows, cfg, device, dtype, pad_id)
        plain_runs.append(plain)
        report(rep, "plain PEFT loop", plain)
        ours = _one_pass("trl", path, rows, cfg, device, dtype, pad_id)
        trl_runs.append(ours)
        report(rep, "TRL StoredRowsTrainer", ours, f" (with trainer setup: {ours['wall_seconds']:.2f} s, "
               f"{ours['wall_tokens_per_s']:.0f} tok/s; pi_old {ours['old_policy']}, "
               f"{ours['old_logps_seconds']:.2f} s scoring it)")
    best_plain = max(r["tokens_per_s"] for r in plain_runs)
    best_trl = max(r["tokens_per_s"] for r in trl_runs)
    best_wall = max(r["wall_tokens_per_s"] for r in trl_runs)
    # CPU time (all threads of this process) is far less sensitive than wall time to other load on the machine
    cpu_plain = min(r["cpu_seconds"] for r in plain_runs)
    cpu_trl = min(r["cpu_seconds"] for r in trl_runs)
    ratio = best_trl / best_plain
    result = {"model": label, "device": device, "dtype": str(dtype), "rows": a.rows, "tokens": plain_runs[0]["tokens"],
              "plain_tokens_per_s": best_plain, "trl_tokens_per_s": best_trl, "ratio": ratio,
              "trl_wall_tokens_per_s": best_wall, "ratio_with_setup": best_wall / best_plain,
              "plain_cpu_seconds": cpu_plain, "trl_cpu_seconds": cpu_trl, "ratio_cpu_time": cpu_plain / cpu_trl,
              "runs": {"plain": plain_runs, "trl": [{k: v for k, v in r.items() if k != "steps"} for r in trl_runs]},
              "goal": 0.9, "ok": ratio >= 0.9, "old_policy": a.old_policy,
              "grad_norm_plain": plain_runs[0]["grad_norm"], "grad_norm_trl": trl_runs[0]["grad_norm"]}
    trl_norms = [s["grad_norm"] for s in trl_runs[0]["steps"]]
    print(f"[bench] per-update grad norms (same rows per update): plain "
          f"{[round(x, 4) for x in plain_runs[0]['grad_norms']]}, TRL {[round(x, 4) for x in trl_norms]}")
    result["grad_norms"] = {"plain": plain_runs[0]["grad_norms"], "trl": trl_norms}
    print(f"[bench] best: plain {best_plain:.0f} tok/s, TRL {best_trl:.0f} tok/s, ratio {ratio:.3f} "
          f"(goal >= 0.9: {'ok' if ratio >= 0.9 else 'MISSED'}); counting TRL's trainer setup: "
          f"{best_wall:.0f} tok/s, ratio {best_wall / best_plain:.3f}; by CPU time: plain {cpu_plain:.2f} s, "
          f"TRL {cpu_trl:.2f} s, ratio {cpu_plain / cpu_trl:.3f}")
    if a.peak_rss:
        for loop in ("plain", "trl"):
            child = _peak_rss(loop, [x for x in argv if x != "--peak-rss"])
            result[f"{loop}_peakrss_mb"] = child["peakrss_mb"]
            result[f"{loop}_rss_loaded_mb"] = child["rss_loaded_mb"]
        print(f"[bench] peak RSS of one pass in a fresh process: plain {result['plain_peakrss_mb']:.0f} MiB, "
              f"TRL {result['trl_peakrss_mb']:.0f} MiB (after loading the model: "
              f"{result['plain_rss_loaded_mb']:.0f} and {result['trl_rss_loaded_mb']:.0f} MiB)")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
