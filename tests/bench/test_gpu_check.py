"""bench/gpu_check.py, the one-shot GPU check, run on the CPU as a GPU session would run it (`--device cpu --shape
tiny`): every part reports a status, the hf part runs seeding, validation, every stage of one iteration and
validation again through the real flow, each stage with its time; a part that fails leaves the others their turn; a
part past its deadline is killed with its children; the tokenizer it builds has the size asked and decodes every id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gpu_check import PARTS, GpuMemory, build_tokenizer, memory_text, run_command
from sage.flows.iteration import STAGE_NAMES

ROOT = Path(__file__).resolve().parents[2]


def _check(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", "--out", str(out), "--work", str(out / "work"),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=660)


def test_the_tokenizer_has_the_size_asked_encodes_any_text_and_decodes_every_id():
    tok = build_tokenizer(1000)
    assert len(tok) == 1000 and (tok.pad_token_id, tok.eos_token_id) == (0, 2)
    text = "Compute 12 + 30. <answer>42</answer> ünïcode ✓"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and max(ids) < 1000
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert tok(chat, add_special_tokens=False)["input_ids"][0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert isinstance(tok.decode(list(range(1024))), str)  # the model's padded vocabulary is larger


@pytest.mark.timeout(720)
def test_the_cpu_dry_run_reports_every_part_and_times_every_stage(tmp_path, prefect_api):
    out = tmp_path / "out"
    proc = _check(out, "--device", "cpu", "--shape", "tiny", "--budget", "600")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    parts = summary["parts"]
    assert {name: part["status"] for name, part in parts.items()} == {
        "build": "ok", "hf": "ok", "vllm": "skipped", "gpu-tests": "skipped"}
    assert list(parts) == list(PARTS)
    assert parts["vllm"]["reason"] == "vLLM needs CUDA (--device cpu)"
    assert "needs CUDA" in parts["gpu-tests"]["reason"] and parts["gpu-tests"]["counts"]["skipped"] >= 1
    hf = parts["hf"]
    assert [(r["iteration"], r["stage"]) for r in hf["stages"]] == \
        [(0, "seed"), (0, "validate"), *((1, name) for name in STAGE_NAMES), (1, "validate")]
    assert all(r["status"] == "done" and r["seconds"] > 0 and r["summary"] for r in hf["stages"])
    assert [v["iteration"] for v in hf["validation"]] == [0, 1]
    assert hf["train"]["device"] == "cpu" and hf["train"]["n_updates"] >= 1
    assert "train.isolate=true" in hf["overrides"] and hf["profile"] == "paper-7b"
    markdown = (out / "summary.md").read_text()
    for name, part in parts.items():
        assert f"| {name} | {part['status']} |" in markdown
    assert "## hf: per stage" in markdown and "| 1 | train | done |" in markdown
    assert "[gpu-check] part hf: ok" in proc.stdout and "[gpu-check] hf: iteration 1 train done" in proc.stdout
    assert {p.name for p in out.iterdir()} >= {"summary.json", "summary.md", "build.log", "hf.log", "gpu-tests.log"}


def test_a_failed_part_leaves_the_others_their_turn(tmp_path):
    """On a machine without CUDA, `--device cuda` fails the build, says why, skips the parts that need the model
    and still runs the test tier; the exit status says a part failed."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    out = tmp_path / "out"
    proc = _check(out, "--shape", "tiny")
    assert proc.returncode == 1
    parts = json.loads((out / "summary.json").read_text())["parts"]
    assert list(parts) == list(PARTS)
    assert parts["build"]["status"] == "failed" and "torch sees no CUDA device" in parts["build"]["error"]
    assert parts["hf"] == {"status": "skipped", "reason": "the model was not built (part build failed)",
                           "seconds": parts["hf"]["seconds"]}
    assert parts["vllm"]["status"] == "skipped"
    assert parts["gpu-tests"]["status"] == "skipped" and "needs CUDA" in parts["gpu-tests"]["reason"]
    assert "| build | failed |" in (out / "summary.md").read_text()


def test_a_part_past_its_deadline_is_killed_with_its_children(tmp_path):
    psutil = pytest.importorskip("psutil")
    script = ("import subprocess, sys, time; "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              "print(child.pid, flush=True); time.sleep(120)")
    start = time.monotonic()
    rc, tail = run_command([sys.executable, "-c", script], tmp_path / "log", 3, dict(os.environ))
    assert rc is None and time.monotonic() - start < 60
    child = int(tail[0])
    deadline = time.monotonic() + 10
    while True:
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < deadline, "the part's child outlived its deadline"
        time.sleep(0.1)


def test_device_memory_per_stage_comes_from_nvidia_smi(tmp_path, monkeypatch):
    """What a GPU machine's nvidia-smi prints (MiB used per GPU, one line each) becomes the stage's device peak and
    what is used after it, in GiB."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 2048\necho 1024\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with GpuMemory(cuda=True, every=0.05) as memory:
        memory.begin("1/train")
        time.sleep(0.2)
        row = memory.end("1/train")
    assert row["device_peak_gib"] == 3.0 and row["device_used_after_gib"] == 3.0
    assert memory_text(row).endswith("; device peak 3.00 GiB, after 3.00")
