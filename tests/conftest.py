"""Test-wide settings (offline, one thread per process: 2-core machines stall with more) and tiny twins."""

import functools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from vlm_grpo.adapters.registry import adapter_class, families  # noqa: E402


def _families() -> list[str]:
    extra = [t for t in os.environ.get("VLM_GRPO_TEST_TYPES", "").split(",") if t]
    return sorted(families()) + extra


@functools.lru_cache(maxsize=None)
def tiny_adapter(family: str):
    return adapter_class(family).tiny(seed=0)


@pytest.fixture(params=_families())
def family(request) -> str:
    return request.param


@pytest.fixture
def adapter(family):
    return tiny_adapter(family)
