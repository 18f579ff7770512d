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

from vlm_grpo.adapters.registry import families, family_class  # noqa: E402


def _families() -> list[str]:
    return sorted(families())


@functools.lru_cache(maxsize=None)
def tiny_adapter(family: str):
    return family_class(family).tiny(seed=0)


@pytest.fixture(params=_families())
def family(request) -> str:
    return request.param


@pytest.fixture
def adapter(family):
    return tiny_adapter(family)


# Markers whose tests run only when asked for by name (`pytest -m NAME`): full matrices too slow for `make test`,
# each with a fast representative subset in the default run.
OPT_IN_MARKERS = ("tools_matrix", "multinode")


def pytest_collection_modifyitems(config, items):
    chosen = config.getoption("-m") or ""
    for name in OPT_IN_MARKERS:
        if name in chosen:
            continue
        deselected = [item for item in items if name in item.keywords]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if name not in item.keywords]
