"""The TRL-based trainer on the tiny local model, on CPU."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sage.configs.schema import TrainConfig
from sage.engines.train.rows import TrainRow, write_rows
from sage.engines.train.step import METRICS_FILE, load_policy, train_model, train_step

#: Keys `StoredRowsTrainer._generate_and_score_completions` returns (the optional ones only when they apply).
BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
              "temperatures")
OPTIONAL_BATCH_KEYS = ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps")

ROOT = Path(__file__).resolve().parents[3]
LINEAR = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _cfg(**kw) -> TrainConfig:
    base = dict(lora_rank=4, lora_alpha=8, lr=1e-3, minibatch_size=2, grad_accum=1)
    base.update(kw)
    return TrainConfig(**base)


def _rows(n: int, seed: int = 0, empty_every: int = 0) -> list[TrainRow]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        c = 0 if empty_every and i % empty_every == empty_every - 1 else rng.randint(3, 10)
        out.append(TrainRow(prompt_ids=[rng.randrange(3, 300) for _ in range(rng.randint(2, 8))],
                            completion_ids=[rng.randrange(3, 300) for _ in range(c)],
                            advantage=rng.uniform(-1, 1), role=("solver", "critic", "planner")[i % 3]))
    return out


def _seq_logprob(model, row: TrainRow) -> float:
    """Summed log-prob of the completion tokens given the prompt, by a plain forward pass."""
    import torch

    ids = torch.tensor([row.prompt_ids + row.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    targets = ids[0, 1:]
    per_token = logp.gather(-1, targets[:, None])[:, 0]
    return float(per_token[len(row.prompt_ids) - 1:].sum())


def _params(model, lora: bool) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ("lora_" in n) == lora}


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """One train_step-equivalent run kept in memory: 4 rows, minibatch 2 -> 2 updates, saved like train_step."""
    from sage.engines.train.step import _atomic_save

    cfg = _cfg()
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    init_lora, init_base = _params(model, True), _params(model, False)
    reported = []
    metrics = train_model(model, str(tiny_model), _rows(4), cfg, seed=0, device="cpu", on_step=reported.append)
    out = tmp_path_factory.mktemp("adapters") / "iter-001"
    _atomic_save(model, out, metrics)
    return {"model": model, "init_lora": init_lora, "init_base": init_base, "metrics": metrics, "out": out,
            "cfg": cfg, "reported": reported}


def _check_reported_steps(reported: list[dict], metrics: dict) -> None:
    """One report per optimizer update, in order, with TRL's logged numbers and the update's own tokens."""
    n = metrics["n_updates"]
    assert [s["step"] for s in reported] == list(range(1, n + 1)) and all(s["updates"] == n for s in reported)
    assert [s["loss"] for s in reported] == [s["loss"] for s in metrics["steps"]]
    assert [s["grad_norm"] for s in reported] == [s["grad_norm"] for s in metrics["steps"]]
    assert all(s["entropy"] is not None and s["clip_fraction"] == 0.0 for s in reported)
    assert all(s["learning_rate"] == metrics["lr"] and s["seconds"] > 0 and s["tokens"] > 0 for s in reported)
    assert sum(s["tokens"] for s in reported) == metrics["tokens"]  # each row in exactly one update


def test_each_update_is_reported_as_it_ends(trained):
    _check_reported_steps(trained["reported"], trained["metrics"])


def test_lora_weights_change_and_base_weights_do_not(trained):
    model = trained["model"]
    lora_now, base_now = _params(model, True), _params(model, False)
    assert lora_now and set(lora_now) == set(trained["init_lora"])
    unchanged = [n for n, p in lora_now.items() if __import__("torch").equal(p, trained["init_lora"][n])]
    assert not unchanged, f"LoRA tensors not updated by 2 steps: {unchanged}"
    for n, p in base_now.items():
        assert __import__("torch").equal(p, trained["init_base"][n]), f"base weight {n} changed"
    m = trained["metrics"]
    assert m["n_updates"] == 2 and m["n_rows"] == 4 and m["n_skipped"] == 0
    assert m["loss"] is not None and m["grad_norm"] > 0 and m["clip_fraction"] == 0.0
    assert m["tokens"] == sum(len(r.prompt_ids) + len(r.completion_ids) for r in _rows(4))
    assert set(m["adv_mean_by_role"]) == {"solver", "critic", "planner"}
    assert m["seconds"] > 0 and m["tokens_per_s"] > 0


def test_saved_adapter_loads_with_peft_bit_exact(trained, tiny_model):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = trained["out"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "temp dirs left behind"
    config = json.loads((out / "adapter_config.json").read_text())
    assert {m.rsplit(".", 1)[-1] for m in config["target_modules"]} == LINEAR  # all linear layers, no lm_head
    assert not config.get("modules_to_save") and not config.get("use_dora")
    assert config["r"] == 4 and config["lora_alpha"] == 8
    assert all("lora_" in k for k in load_file(out / "adapter_model.safetensors"))
    assert json.loads((out / METRICS_FILE).read_text())["n_updates"] == 2

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, out)
    trained_lora = _params(trained["model"], True)
    loaded_lora = _params(loaded, True)
    assert set(loaded_lora) == set(trained_lora)
    for n, p in loaded_lora.items():
        assert torch.equal(p, trained_lora[n]), n
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    trained["model"].eval()
    with torch.no_grad():
        a = loaded(input_ids=ids).logits
        b = trained["model"](input_ids=ids).logits
    assert torch.equal(a, b)


def test_train_step_moves_logprob_with_advantage_sign(tiny_model, tmp_path):
    """A large-lr step raises the log-prob of the positive rollout and lowers the negative one's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    prompt = [20, 21, 22, 23, 24]
    pos = TrainRow(prompt, [40, 41, 42, 43, 44, 45], advantage=1.0, role="solver")
    neg = TrainRow(prompt, [60, 61, 62, 63, 64, 65], advantage=-1.0, role="critic")
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    before = {"pos": _seq_logprob(base, pos), "neg": _seq_logprob(base, neg)}
    out = tmp_path / "a1"
    m = train_step(str(tiny_model), None, str(out), [pos, neg], _cfg(lora_rank=8, lora_alpha=16, lr=5e-3),
                   seed=0, device="cpu")
    assert m["n_updates"] == 1 and m["adv_mean_by_role"] == {"critic": -1.0, "solver": 1.0}
    policy = PeftModel.from_pretrained(base, out).eval()
    after = {"pos": _seq_logprob(policy, pos), "neg": _seq_logprob(policy, neg)}
    assert after["pos"] > before["pos"] + 1e-3, (before, after)
    assert after["neg"] < before["neg"] - 1e-3, (before, after)

    # Continue from the adapter (adapter_in): the second step keeps moving in the same direction.
    out2 = tmp_path / "a2"
    train_step(str(tiny_model), str(out), str(out2), [pos, neg], _cfg(lora_rank=8, lora_alpha=16, lr=5e-3),
               seed=1, device="cpu")
    base2 = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    policy2 = PeftModel.from_pretrained(base2, out2).eval()
    assert _seq_logprob(policy2, pos) > after["pos"] and _seq_logprob(policy2, neg) < after["neg"]


def test_every_row_once_and_empty_completions_skipped(tiny_model, monkeypatch):
    """11 rows (2 with empty completions) -> 9 used; minibatch 2 x grad_accum 2 -> 3 updates (the last one on one
    real row and a masked dummy), each row seen exactly once."""
    from sage.engines.train.trainer import StoredRowsTrainer as cls

    seen = []
    original = cls._generate_and_score_completions

    def spy(self, inputs):
        seen.extend(int(x["row"]) for x in inputs)
        out = original(self, inputs)
        assert out["prompt_ids"].shape[0] % self.args.steps_per_generation == 0
        return out

    monkeypatch.setattr(cls, "_generate_and_score_completions", spy)
    rows = _rows(11, seed=3, empty_every=4)
    cfg = _cfg(minibatch_size=2, grad_accum=2)
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    m = train_model(model, str(tiny_model), rows, cfg, device="cpu")
    assert m["n_rows"] == 9 and m["n_skipped"] == 2 and m["n_updates"] == 3
    assert sorted(i for i in seen if i >= 0) == list(range(9))


def test_sampler_blocks_padding_and_seed():
    from sage.engines.train.trainer import BlockRepeatSampler as S
    from sage.engines.train.trainer import update_blocks

    assert update_blocks(5, 4, False, 0) == [[0, 1, 2, 3], [4, None, None, None]]

    s = S(n_rows=5, block=4, repeats=2, dummy=5, shuffle=False, seed=0)
    assert list(s) == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 5, 5, 4, 5, 5, 5] and len(s) == 16
    a = list(S(n_rows=9, block=3, repeats=1, dummy=9, shuffle=True, seed=7))
    assert sorted(a) == list(range(9)) and a == list(S(9, 3, 1, 9, True, 7)) and a != list(range(9))


# ------------------------------------------------------------------------------------------------------------
# Pinned-TRL contract: fails loudly when TRL's private methods we override change shape.

EXPECTED_LOSS_SUBSCRIPT_KEYS = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
                                "num_items_in_batch", "ref_per_token_logps", "importance_sampling_ratio",
                                "tool_mask"}
EXPECTED_LOSS_GET_KEYS = {"tool_mask", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
                          "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids",
                          "image_position_ids", "old_per_token_logps", "sampling_per_token_logps",
                          "importance_sampling_ratio"}


def _input_keys(func) -> tuple[set[str], set[str]]:
    """Keys a method reads from its `inputs` argument: inputs["k"] and inputs.get("k") / `"k" in inputs`."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    subscript, get = set(), set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "inputs"
                and isinstance(node.slice, ast.Constant)):
            subscript.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "inputs" and node.args
              and isinstance(node.args[0], ast.Constant)):
            get.add(node.args[0].value)
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and any(isinstance(c, ast.Name) and c.id == "inputs" for c in node.comparators)):
            get.add(node.left.value)
    return subscript, get


def test_trl_contract_pinned():
    import trl
    from trl import GRPOTrainer

    from sage.engines.train.trainer import StoredRowsTrainer

    # The methods the module docstring lists, and no others, replace TRL's (each still exists in TRL).
    overrides = {name for name, value in vars(StoredRowsTrainer).items()
                 if callable(value) and hasattr(GRPOTrainer, name) and name != "__init__"}
    assert overrides == {"_get_train_sampler", "_generate_and_score_completions", "_prepare_inputs",
                         "_get_per_token_logps_and_entropies", "_compute_loss", "create_optimizer",
                         "create_scheduler", "log"}, overrides

    assert trl.__version__.startswith("1.16."), f"trl {trl.__version__}: re-check engines/train/trainer.py's overrides"
    sig = inspect.signature(GRPOTrainer._generate_and_score_completions)
    assert list(sig.parameters) == ["self", "inputs"], sig
    assert list(inspect.signature(GRPOTrainer._get_train_sampler).parameters) == ["self", "dataset"]
    assert list(inspect.signature(GRPOTrainer._compute_loss).parameters) == ["self", "model", "inputs"]
    subscript, get = _input_keys(GRPOTrainer._compute_loss)
    assert subscript == EXPECTED_LOSS_SUBSCRIPT_KEYS, f"_compute_loss now requires {subscript}"
    assert get == EXPECTED_LOSS_GET_KEYS, f"_compute_loss now optionally reads {get}"
    # What we feed: every required key, except those read only with beta != 0 (we add it then), with vLLM, or
    # behind `"tool_mask" in inputs`.
    assert subscript - set(BATCH_KEYS) == {"ref_per_token_logps", "importance_sampling_ratio", "tool_mask"}
    assert set(OPTIONAL_BATCH_KEYS) <= subscript | get
    # The importance correction (`_weigh`) weighs the advantages per token inside the log-prob call, which TRL's
    # loss makes before it reads them, and TRL takes per-token (B, T) advantages.
    loss_src = inspect.getsource(GRPOTrainer._compute_loss)
    assert (loss_src.index("self._get_per_token_logps_and_entropies(") < loss_src.index('inputs["advantages"]')
            and "if advantages.dim() == 1:" in loss_src)
    # _prepare_inputs builds the generation batch once per steps_per_generation micro-steps and slices it.
    prep = inspect.getsource(GRPOTrainer._prepare_inputs)
    for needle in ("self._generate_and_score_completions(generation_batch)", "split_tensor_dict(",
                   "self.args.steps_per_generation", "self._buffered_inputs[self._step % "):
        assert needle in prep, f"GRPOTrainer._prepare_inputs changed: {needle!r} missing"
    # We replace the log-prob method `_compute_loss` calls (same signature, entropy asked for), and score with
    # TRL's chunked log-prob kernel (engines/train/logprobs.py).
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction, _use_triton
    from trl.trainer import utils

    assert callable(_use_triton) and callable(utils.maybe_gather_lm_head_ctx) and utils._CHUNKED_LOGPROB_CHUNK_SIZE > 0
    assert list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)[:7] == [
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"]
    assert "compute_entropy=True" in inspect.getsource(GRPOTrainer._compute_loss)
    assert list(inspect.signature(ChunkedLogProbFunction.forward).parameters) == [
        "ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size", "final_logit_softcapping",
        "logit_scale", "outputs"]


def test_one_step_contract(tiny_model):
    """Our batch has the keys, shapes and dtypes `_compute_loss` needs, and one loss evaluates finite."""
    import math

    import torch

    from sage.engines.train.trainer import build_trainer

    cfg = _cfg(minibatch_size=2, grad_accum=2, kl_beta=0.1)
    rows = _rows(3, seed=5)
    rows[0].logprobs = rows[1].logprobs = rows[2].logprobs = None
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    trainer, _ = build_trainer(model, str(tiny_model), rows, cfg, seed=0, device="cpu",
                               torch_dtype=torch.float32)
    try:
        batch = trainer._generate_and_score_completions([{"row": 0}, {"row": 1}, {"row": 2}, {"row": -1}])
        assert set(BATCH_KEYS) <= set(batch) and "ref_per_token_logps" in batch
        assert "old_per_token_logps" not in batch
        b, c = batch["completion_ids"].shape
        assert b == 4 and c == max(len(r.completion_ids) for r in rows)
        assert batch["completion_mask"].sum().item() == batch["num_items_in_batch"].item()
        assert batch["completion_mask"][3].sum() == 0 and batch["advantages"].dtype == torch.float32
        assert batch["ref_per_token_logps"].shape == (b, c)
        # prompts left-padded, completions right-padded
        assert batch["prompt_mask"][:, -1].all() and batch["completion_mask"][:3, 0].all()
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = cfg.grad_accum  # set by Trainer.train() otherwise
        loss = trainer.compute_loss(trainer.model, {k: v[:2] if torch.is_tensor(v) and v.dim() else v
                                                    for k, v in batch.items()})
        assert loss.dim() == 0 and math.isfinite(loss.item())
    finally:
        import shutil

        shutil.rmtree(trainer.args.output_dir, ignore_errors=True)


def test_subprocess_entry_point(tiny_model, tmp_path):
    rows = _rows(5, seed=1, empty_every=5)
    rows[0].logprobs = [-1.0] * len(rows[0].completion_ids)  # mixed: stored for some rows only
    path = tmp_path / "rows.parquet"
    write_rows(rows, path)
    out, metrics, steps = tmp_path / "adapter", tmp_path / "m" / "metrics.json", tmp_path / "steps.jsonl"
    cfg = _cfg(minibatch_size=2, grad_accum=1).model_dump_json()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "sage.engines.train", "--in", str(path), "--out", str(out),
                           "--model", str(tiny_model), "--config", cfg, "--metrics", str(metrics),
                           "--steps", str(steps), "--device", "cpu"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(metrics.read_text())
    _check_reported_steps([json.loads(line) for line in steps.read_text().splitlines()], m)
    assert m["n_rows"] == 4 and m["n_skipped"] == 1 and m["n_updates"] == 2 and m["corrected_rows"] == 1
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert json.loads((out / METRICS_FILE).read_text())["n_rows"] == 4


@pytest.mark.gpu
def test_gpu_train_step_script():
    """bench/train_gpu.py on CUDA, small: one bf16 step of a 0.5B-shaped Qwen2 with LoRA r=128."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train_gpu.py"), "--rows", "4",
                           "--prompt-len", "64", "--completion-len", "192"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tokens/s" in proc.stdout


def test_micro_batches_by_length_and_the_update_does_not_depend_on_the_cut(tiny_model):
    """Each update's rows go into micro-batches longest first; the adapter equals the one trained with each update
    in a single micro-batch (the sampler, not the cut, decides which rows make an update)."""
    import shutil

    import torch

    from sage.engines.train.trainer import build_trainer

    rows = _rows(12, seed=7)
    split, whole = _cfg(minibatch_size=2, grad_accum=3), _cfg(minibatch_size=6, grad_accum=1)
    model = load_policy(str(tiny_model), None, split, seed=0)
    trainer, _ = build_trainer(model, str(tiny_model), rows, split, seed=0, device="cpu", torch_dtype=torch.float32)
    try:
        model.train()
        trainer._step, trainer._buffered_inputs = 0, None
        trainer._prepare_inputs([{"row": i} for i in range(6)])
        micro = trainer._buffered_inputs
        lengths = [int(m["prompt_mask"][i].sum() + m["completion_mask"][i].sum()) for m in micro for i in range(2)]
        assert len(micro) == 3 and lengths == sorted(lengths, reverse=True)
        assert sorted(lengths) == sorted(len(r.prompt_ids) + len(r.completion_ids) for r in rows[:6])
    finally:
        shutil.rmtree(trainer.args.output_dir, ignore_errors=True)
    adapters = []
    for cfg in (split, whole):
        model = load_policy(str(tiny_model), None, cfg, seed=0)
        train_model(model, str(tiny_model), rows, cfg, seed=0, device="cpu")
        adapters.append(_params(model, True))
    initial = _params(load_policy(str(tiny_model), None, split, seed=0), True)
    assert any(not torch.equal(p, initial[n]) for n, p in adapters[0].items())  # it trained
    for name, p in adapters[0].items():
        torch.testing.assert_close(p, adapters[1][name], rtol=1e-5, atol=1e-6)


def test_dealt_spreads_the_longest_rows_over_the_micro_batches():
    """Packed passes: rows sorted longest first are dealt in snake order, so each micro-batch of an update holds
    about the same tokens; every row stays, each once."""
    import torch

    from sage.engines.train.trainer import dealt, longest_first

    lengths = torch.tensor([5, 90, 40, 70, 10, 60, 20, 80])
    batch = {"prompt_mask": (torch.arange(100)[None, :] < lengths[:, None]).long(),
             "completion_mask": torch.zeros(8, 3, dtype=torch.long), "row": torch.arange(8),
             "num_items_in_batch": torch.tensor(7)}
    out = dealt(longest_first(batch), 4)
    got = out["prompt_mask"].sum(1).tolist()
    assert got == [90, 5, 80, 10, 70, 20, 60, 40]  # parts (90, 5), (80, 10), (70, 20), (60, 40)
    assert sorted(out["row"].tolist()) == list(range(8)) and int(out["num_items_in_batch"]) == 7
    assert dealt(batch, 1) is batch and dealt(batch, 3) is batch  # one part, or parts that do not divide the rows


def test_packed_micro_batches_are_dealt_by_length(tiny_model):
    """With the CPU attention that packs a micro-batch's rows, an update's micro-batches are dealt (the longest row
    beside the shortest), not cut longest first: the largest pass, which sets training's peak memory, is close to
    the mean."""
    import shutil

    import torch

    from sage.engines.train.attention import use_cpu_attention
    from sage.engines.train.trainer import build_trainer

    rows = _rows(12, seed=7)
    cfg = _cfg(minibatch_size=2, grad_accum=3)
    model = load_policy(str(tiny_model), None, cfg, seed=0)
    trainer, _ = build_trainer(model, str(tiny_model), rows, cfg, seed=0, device="cpu", torch_dtype=torch.float32)
    try:
        model.train()
        trainer._step, trainer._buffered_inputs = 0, None
        with use_cpu_attention(model):
            trainer._prepare_inputs([{"row": i} for i in range(6)])
        micro = trainer._buffered_inputs
        lengths = [[int(m["prompt_mask"][i].sum() + m["completion_mask"][i].sum()) for i in range(2)] for m in micro]
        ranked = sorted((n for pair in lengths for n in pair), reverse=True)
        assert lengths == [[ranked[0], ranked[5]], [ranked[1], ranked[4]], [ranked[2], ranked[3]]]
    finally:
        shutil.rmtree(trainer.args.output_dir, ignore_errors=True)


def test_trackers_get_every_update_as_tensorboard_event_files(tiny_model, tmp_path):
    """`train.report_to: [tensorboard]` through the training child process: one event per optimizer update, with
    the loss the update reported, in the run's folder the train stage names (not under the removed output dir), at
    the run's global step: a second pass with `step_offset` 3 (the first pass's updates) goes on at 4, 5, 6, so the
    two passes are one curve."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sage.engines.train.launch import train_isolated

    logdir = tmp_path / "tensorboard" / "run"
    reported: list[dict] = []
    for k, offset in ((1, 0), (2, 3)):
        train_isolated(str(tiny_model), None, str(tmp_path / f"adapter-{k}"), _rows(6, seed=3),
                       _cfg(minibatch_size=2, report_to=["tensorboard"]), seed=0, on_step=reported.append,
                       tracking={"run_name": "run", "logging_dir": str(logdir), "step_offset": offset})
    assert list(logdir.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(logdir))
    events.Reload()
    loss = sorted(events.Scalars("train/loss"), key=lambda e: e.step)
    assert [r["step"] for r in reported] == [1, 2, 3, 1, 2, 3] and [e.step for e in loss] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in reported])
    assert {"train/grad_norm", "train/learning_rate", "train/entropy"} <= set(events.Tags()["scalars"])
    assert '"run_name": "run"' in events.Tensors("args/text_summary")[0].tensor_proto.string_val[0].decode()
