"""`sage export` on the tiny local model: the adapter copied as peft saved it (without the optimizer state), and a
merged model directory whose logits equal base + adapter through peft."""

from __future__ import annotations

import filecmp

import pytest
import typer
from typer.testing import CliRunner

from sage.configs import config_hash, config_json, load_config
from sage.engines.train import OPTIMIZER_FILE, ROLES_DIR
from sage.flows.export import ExportError, export_adapter, export_command
from sage.warehouse import Warehouse
from sage.warehouse.checkpoints import record_pruned
from sage.warehouse.validate_queries import mark_best, record_validation

PROMPT = "What is 7 * 8? The answer is"


@pytest.fixture(scope="module")
def project(tiny_model, tmp_path_factory):
    """A warehouse with run `r` (base model = the tiny model): baseline 'base' checkpoint at 0.25, a trained
    adapter at iteration 1 validated at 0.5 (best), run `nobest` with an unvalidated checkpoint, and run `pruned`
    whose checkpoint's adapter checkpoint retention deleted."""
    from sage.configs.schema import TrainConfig
    from sage.engines.train.rows import TrainRow
    from sage.engines.train.step import train_step

    d = tmp_path_factory.mktemp("export")
    adapter = d / "adapters" / "r" / "iteration-1"
    rows = [TrainRow(prompt_ids=[5, 6, 7, 8], completion_ids=[9, 10, 11, 12, 13], advantage=1.0, role="solver"),
            TrainRow(prompt_ids=[5, 6, 7, 8], completion_ids=[14, 15, 16], advantage=-1.0, role="solver")]
    train_step(str(tiny_model), None, str(adapter), rows, TrainConfig(lora_rank=4, lora_alpha=16, lr=5e-2,
               minibatch_size=2), seed=0, device="cpu")
    cfg = load_config("cpu", [f"run.dir={d}", f"model.name={tiny_model}", f"model.cache_dir={d}/models"])
    with Warehouse.open(d / "warehouse.duckdb") as wh:
        for rid in ("r", "nobest", "pruned"):
            wh.insert_batch("runs", [dict(run_id=rid, config=config_json(cfg), config_hash=config_hash(cfg),
                                          base_model=cfg.model.name, seed=0)])
        wh.insert_batch("checkpoints", [dict(run_id=rid, iteration=1, adapter_path=str(adapter))
                                        for rid in ("r", "nobest", "pruned")])
        record_pruned(wh, "pruned", adapters=[1], optimizers=[])
        record_validation(wh, "r", 0, "base", dict(val_accuracy=0.25, val_math=0.5, val_code=0.0))
        record_validation(wh, "r", 1, str(adapter), dict(val_accuracy=0.5, val_math=0.5, val_code=0.5))
        assert mark_best(wh, "r") == 1
    return d, adapter


def _logits(model, tokenizer):
    import torch

    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits[0].float()


def test_export_adapter_and_merged_model_give_the_same_logits(project, tiny_model, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, adapter = project
    planner = adapter / ROLES_DIR / "planner"  # another role's own adapter (train.adapters per_role): not the Solver's
    planner.mkdir(parents=True, exist_ok=True)
    (planner / "adapter_config.json").write_text("{}")
    with Warehouse.open(d / "warehouse.duckdb", read_only=True) as wh:
        copied = export_adapter(wh, "r", "best", tmp_path / "adapter", merge=False)
        merged = export_adapter(wh, "r", "1", tmp_path / "merged", merge=True)
    assert copied == (tmp_path / "adapter").resolve() and merged == (tmp_path / "merged").resolve()
    names = sorted(p.name for p in adapter.iterdir() if p.name not in (OPTIMIZER_FILE, ROLES_DIR))
    assert (adapter / OPTIMIZER_FILE).is_file() and "adapter_config.json" in names  # the next iteration's, not served
    assert sorted(p.name for p in copied.iterdir()) == names
    assert not filecmp.cmpfiles(adapter, copied, names, shallow=False)[1]  # byte for byte, nothing mismatched
    assert (merged / "config.json").is_file() and not (merged / "adapter_config.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left

    tokenizer = AutoTokenizer.from_pretrained(merged)
    assert tokenizer(PROMPT).input_ids == AutoTokenizer.from_pretrained(tiny_model)(PROMPT).input_ids
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    plain = _logits(base, tokenizer)
    with_adapter = _logits(PeftModel.from_pretrained(base, copied).eval(), tokenizer)
    from_merged = _logits(AutoModelForCausalLM.from_pretrained(merged).eval(), tokenizer)
    assert (with_adapter - plain).abs().max() > 1e-3  # the adapter changes the model, so the check means something
    assert (from_merged - with_adapter).abs().max() < 1e-4


def test_checkpoint_names_and_errors(project, tmp_path):
    d, adapter = project
    with Warehouse.open(d / "warehouse.duckdb", read_only=True) as wh:
        assert (export_adapter(wh, "r", "latest", tmp_path / "latest", merge=False) / "adapter_config.json").is_file()
        base = export_adapter(wh, "r", "0", tmp_path / "base", merge=True)  # the base model itself, merged: a copy
        assert (base / "config.json").is_file()
        for run_id, checkpoint, dest, merge, message in [
            ("nope", "best", "a", False, "no run 'nope'"),
            ("r", "7", "a", False, "no checkpoint for iteration 7"),
            ("r", "newest", "a", False, "use 'best', 'latest' or an iteration"),
            ("nobest", "best", "a", False, "no best checkpoint yet"),
            ("r", "0", "a", False, "the base model itself"),
            ("r", "best", "latest", False, "already exists"),
            ("pruned", "1", "a", False, "checkpoint retention deleted its adapter"),
            ("pruned", "latest", "a", True, "checkpoint retention deleted its adapter"),
        ]:
            with pytest.raises(ExportError, match=message):
                export_adapter(wh, run_id, checkpoint, tmp_path / dest, merge)
    assert not (tmp_path / "a").exists()


def test_export_command(project, tmp_path):
    d, _ = project
    app = typer.Typer()
    app.command("export")(export_command)
    app.command("other")(lambda: None)  # two commands, so `export` is a subcommand as in `sage`
    ok = CliRunner().invoke(app, ["export", "--run", "r", "--dir", str(d), "--dest", str(tmp_path / "out")])
    assert ok.exit_code == 0, ok.output
    assert "iteration 1" in ok.output and f"wrote adapter to {(tmp_path / 'out').resolve()}" in ok.output
    assert "adapter_config.json" in ok.output
    bad = CliRunner().invoke(app, ["export", "--run", "nobest", "--dir", str(d), "--dest", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "no best checkpoint yet" in bad.output


def test_export_merge_shows_no_library_progress_bars(project, tmp_path):
    """`sage export --merge` loads and saves a model: transformers' and the hub's progress bars stay off, so the
    terminal shows the command's own lines only."""
    import os
    import subprocess
    import sys

    d, _ = project
    r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "export", "--run", "r", "--checkpoint", "1",
                        "--merge", "--dir", str(d), "--dest", str(tmp_path / "merged")], capture_output=True,
                       text=True, timeout=300, env={k: v for k, v in os.environ.items()
                                                   if k != "HF_HUB_DISABLE_PROGRESS_BARS"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "wrote merged model (with tokenizer)" in r.stdout
    assert "%|" not in r.stderr and "it/s" not in r.stderr and "Loading" not in r.stderr, r.stderr[-3000:]
