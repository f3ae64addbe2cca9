"""Data-parallel training: the train step under `accelerate launch` with two CPU processes (gloo), started by the
code the train stage runs (`launch.train` with `configs/accelerate/cpu-2proc.yaml`), checked against one process
on the same global batch. fp32 throughout, so the two may differ only by float rounding."""

from __future__ import annotations

import json
import math
import re

import pytest

from sage.configs import ConfigError
from sage.configs.schema import TrainConfig
from sage.engines.train.launch import ACCELERATE_DIR, accelerate_config_path, train, trainer_command
from sage.engines.train.rows import rows_per_update
from sage.engines.train.step import METRICS_FILE, load_policy, train_step
from tests.engines.train.test_trainer import _rows

TRAIN = dict(lora_rank=4, lora_alpha=8, lr=1e-3)
SEED = 0  # run.seed; the stage trains iteration 1 with seed run.seed + 1
ROWS = dict(n=11, seed=3, empty_every=6)  # row 5 has an empty completion: 10 usable rows
PER_PROCESS = dict(minibatch_size=1, grad_accum=2)  # x 2 processes = 4 rows per update
ONE_PROCESS = dict(minibatch_size=2, grad_accum=2)  # the same 4 rows per update in one process


def _lora(path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "adapter_model.safetensors")


def _launch(tiny_model, directory, accelerate_config: str, batch: dict = PER_PROCESS) -> dict:
    """What the train stage runs with `train.accelerate_config` set (iteration 1: seed run.seed + 1)."""
    cfg = TrainConfig(**TRAIN, **batch, accelerate_config=accelerate_config)
    out = directory / "adapters" / "iteration-1"
    out.parent.mkdir(parents=True)
    steps: list[dict] = []
    metrics = train(str(tiny_model), None, str(out), _rows(**ROWS), cfg, seed=SEED + 1, dtype="float32",
                    on_step=steps.append)
    assert [s["step"] for s in steps] == list(range(1, metrics["n_updates"] + 1))  # one report per update
    return {"metrics": metrics, "out": out}


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def launched(tiny_model, tmp_path_factory):
    return _launch(tiny_model, tmp_path_factory.mktemp("launched"), "cpu-2proc")


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    """One process, twice the per-device batch, same seed and rows."""
    out = tmp_path_factory.mktemp("reference") / "adapter"
    metrics = train_step(str(tiny_model), None, str(out), _rows(**ROWS), TrainConfig(**TRAIN, **ONE_PROCESS),
                         seed=SEED + 1, device="cpu", dtype="float32")
    return {"metrics": metrics, "out": out}


def test_each_process_trains_its_own_slice_of_every_update(launched, reference):
    m = launched["metrics"]
    assert m["num_processes"] == 2 and m["distributed"] == "MULTI_CPU" and m["n_rows"] == 10 and m["n_skipped"] == 1
    assert m["n_updates"] == reference["metrics"]["n_updates"] == 3  # ceil(10 / 4)
    rank0, rank1 = m["rows_by_rank"]
    usable = [i for i in range(ROWS["n"]) if i != 5]
    assert not set(rank0) & set(rank1), "the processes trained on the same rows"
    assert sorted(rank0 + rank1) == usable, "together the processes did not cover every row exactly once"
    # Update u is the u-th block of one process's order; process k takes the k-th slice of each block.
    order = reference["metrics"]["rows_by_rank"][0]
    block, piece = rows_per_update(TrainConfig(**PER_PROCESS), 2), rows_per_update(TrainConfig(**PER_PROCESS))
    assert sorted(order) == usable and block == 4 and piece == 2
    for u in range(m["n_updates"]):
        mine = [order[u * block + k * piece:u * block + (k + 1) * piece] for k in (0, 1)]
        assert rank0[u * piece:(u + 1) * piece] == mine[0] and rank1[u * piece:(u + 1) * piece] == mine[1], u
    assert len(rank1) == 4  # the last update has 2 rows: process 1 gets only masked padding rows there


def test_two_processes_match_one_process_on_the_same_global_batch(launched, reference):
    two, one = launched["metrics"], reference["metrics"]
    assert math.isfinite(two["loss"]) and two["loss"] == pytest.approx(one["loss"], abs=1e-5)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    diff = _max_diff(_lora(launched["out"]), _lora(reference["out"]))
    assert diff <= 1e-4, f"LoRA weights differ by up to {diff:.3g} between 2 processes and 1"


def test_one_adapter_saved_by_the_main_process_and_trained(launched, tiny_model):
    out = launched["out"]
    assert [p.name for p in out.parent.iterdir()] == [out.name], "temp or duplicate adapter dirs left behind"
    saved = json.loads((out / METRICS_FILE).read_text())
    assert saved["num_processes"] == 2 and saved["rows_by_rank"] == launched["metrics"]["rows_by_rank"]
    init = {k.replace(".default", ""): v for k, v in
            load_policy(str(tiny_model), None, TrainConfig(**TRAIN), seed=SEED + 1).state_dict().items()
            if "lora_" in k}
    trained = _lora(out)
    assert set(trained) == set(init)
    unchanged = [k for k, v in trained.items() if (v - init[k]).abs().max().item() == 0]
    assert not unchanged, f"LoRA tensors not updated: {unchanged}"


def test_accelerate_configs_by_short_name_and_path(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    expected = {"ddp": "MULTI_GPU", "deepspeed-zero2": "DEEPSPEED", "fsdp": "FSDP", "cpu-2proc": "MULTI_GPU"}
    for name, kind in expected.items():
        path = accelerate_config_path(name)
        assert path == (ACCELERATE_DIR / f"{name}.yaml").resolve()
        assert accelerate_config_path(f"{name}.yaml") == path
        loaded = load_config_from_file(str(path))
        assert str(loaded.distributed_type).rsplit(".", 1)[-1] == kind and loaded.num_machines == 1
        assert loaded.mixed_precision == "no"  # the trainer's own dtype decides
    cpu = load_config_from_file(str(accelerate_config_path("cpu-2proc")))
    assert cpu.use_cpu and cpu.num_processes == 2
    assert load_config_from_file(str(accelerate_config_path("deepspeed-zero2"))).deepspeed_config["zero_stage"] == 2
    own = tmp_path / "mine.yaml"
    own.write_text((ACCELERATE_DIR / "ddp.yaml").read_text())
    assert accelerate_config_path(str(own)) == own.resolve()
    cmd = trainer_command(["--in", "x"], str(own))
    assert cmd[1:5] == ["-m", "accelerate.commands.launch", "--config_file", str(own.resolve())]
    assert cmd[5:] == ["-m", "sage.engines.train", "--in", "x"]
    # use_cpu reaches the trainer, which the multi-process CPU launcher would not tell
    assert trainer_command(["--in", "x"], "cpu-2proc")[-2:] == ["--device", "cpu"]
    assert trainer_command(["--in", "x"])[1:] == ["-m", "sage.engines.train", "--in", "x"]


def test_unknown_accelerate_config_names_the_choices():
    with pytest.raises(ConfigError) as err:
        accelerate_config_path("dpp")
    message = str(err.value)
    assert "'dpp'" in message and "train.accelerate_config" in message
    for name in ("cpu-2proc", "ddp", "deepspeed-zero2", "fsdp"):
        assert name in message


@pytest.mark.gpu
def test_fsdp_on_one_gpu_saves_the_gathered_adapter(tiny_model, tmp_path):
    """fsdp.yaml with one process on CUDA (accelerate turns FSDP on only for GPUs): the weights are sharded, so
    the adapter is saved from the gathered state dict; it must match a plain one-process run."""
    text = (ACCELERATE_DIR / "fsdp.yaml").read_text()
    for key, value in (("num_processes", "1"), ("main_process_port", "0")):
        text = re.sub(rf"^{key}: .*$\n?", "", text, flags=re.M) + f"{key}: {value}\n"
    config = tmp_path / "fsdp-1gpu.yaml"
    config.write_text(text)
    run = _launch(tiny_model, tmp_path / "fsdp", str(config), ONE_PROCESS)
    assert run["metrics"]["distributed"] == "FSDP" and run["metrics"]["device"] == "cuda"
    ref = tmp_path / "plain"
    train_step(str(tiny_model), None, str(ref), _rows(**ROWS), TrainConfig(**TRAIN, **ONE_PROCESS), seed=SEED + 1,
               device="cuda", dtype="float32")
    diff = _max_diff(_lora(run["out"]), _lora(ref))
    assert diff <= 1e-4, f"FSDP LoRA weights differ by up to {diff:.3g} from one plain process's"
