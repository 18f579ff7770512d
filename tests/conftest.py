"""Test-wide settings (offline, one thread per process: 2-core machines stall with more) and tiny twins."""

import functools
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from vlm_grpo.adapters.generic.status import generic_types  # noqa: E402
from vlm_grpo.adapters.registry import adapter_class, families, image_families, is_generic_type  # noqa: E402


def _families() -> list[str]:
    """The families the image contract runs on (the text-only family has its own tests, tests/api)."""
    return sorted(image_families())


def contract_types() -> list[str]:
    """Every family, and every model type recorded as passing through the generic adapter (adapters/generic/
    model_types.json); `VLM_GRPO_CONTRACT_TYPES=a,b` (used by `vlm-grpo families --all --measure`) picks others."""
    only = [t for t in os.environ.get("VLM_GRPO_CONTRACT_TYPES", "").split(",") if t]
    return only or _families() + [t for t in generic_types() if is_generic_type(t)]


@functools.lru_cache(maxsize=None)
def tiny_adapter(family: str):
    return adapter_class(family).tiny(seed=0)


@pytest.fixture(params=_families())
def family(request) -> str:
    return request.param


@pytest.fixture
def adapter(family):
    return tiny_adapter(family)


def families_with(flag: str) -> list[str]:
    """The families whose adapter class sets `flag` (e.g. `shares_features`): the tests of that path run on them."""
    return [name for name in _families() if getattr(families()[name], flag)]


def families_without(flag: str) -> list[str]:
    return [name for name in _families() if not getattr(families()[name], flag)]


# Markers whose tests run only when asked for by name (`pytest -m NAME`): full matrices too slow for `make test`,
# each with a fast representative subset in the default run.
OPT_IN_MARKERS = ("tools_matrix", "multinode", "generic_matrix", "fault_matrix", "recipe_matrix", "browser")


def covering_pairs(columns: list[str], rows: list[str], per_column: int, marker: str) -> list:
    """Every (column, row) pair as a pytest param; by default a covering subset runs: each column with `per_column`
    rows, taken in turn so that every row runs on about len(columns) * per_column / len(rows) columns. The other
    pairs carry `marker` (opt-in: `pytest -m MARKER` runs them)."""
    chosen = {(column, rows[(i * per_column + k) % len(rows)]) for i, column in enumerate(columns) for k in range(per_column)}
    return [pytest.param(column, row, marks=() if (column, row) in chosen else getattr(pytest.mark, marker))
            for column in columns for row in rows]


# The fast tier (`make test-fast`, `pytest --fast`): every test recorded (tests/durations.json, `make durations`)
# as taking at most FAST_SECONDS; a test not recorded yet runs too. Units, contracts and probes on the tiny twins,
# no training runs.
FAST_SECONDS = 0.15
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true", help=f"only tests recorded at <= {FAST_SECONDS} s "
                     "(tests/durations.json; make durations refreshes it)")


SHARED_SCOPES = ("class", "module", "package")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """For `make durations`: each test's setup time and the shared (class/module-scoped) fixtures it uses, as JUnit
    properties. The first test of a file pays a module fixture's setup; in the fast tier another would, so
    scripts/test_durations.py charges that setup to every test using the fixture."""
    yield
    if call.when == "setup":
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        params = getattr(getattr(item, "callspec", None), "params", {})  # a parametrized fixture: one setup per value
        shared = sorted(f"{name}[{params[name]}]" if name in params else name
                        for name, chain in defs.items() if chain and chain[-1].scope in SHARED_SCOPES)
        item.user_properties += [("setup_seconds", f"{call.duration:.3f}"), ("shared_fixtures", ",".join(shared))]


def _slow(items, config) -> list:
    if not config.getoption("--fast") or not DURATIONS.is_file():
        return []
    seconds = json.loads(DURATIONS.read_text())
    return [item for item in items if seconds.get(item.nodeid, 0.0) > FAST_SECONDS]


def _longest_files_first(items) -> None:
    """Whole files by their recorded time, longest first, each file's tests in their own order: with
    `--dist loadfile --no-loadscope-reorder` (make test) the two processes take the long files (multi-process launches,
    the real LM) at the start instead of finishing on them one by one."""
    if not DURATIONS.is_file():
        return
    seconds = json.loads(DURATIONS.read_text())
    per_file: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        per_file[path] = per_file.get(path, 0.0) + seconds.get(item.nodeid, 0.0)
    order = {id(item): k for k, item in enumerate(items)}
    items.sort(key=lambda item: (-per_file[item.nodeid.split("::", 1)[0]], item.nodeid.split("::", 1)[0], order[id(item)]))


def _generic_types_in_turn(items) -> None:
    """The contract suite on the generic adapter's model types, by default: each type under every other contract test,
    each test on every other type, in turn (the rest carry `generic_matrix`: `pytest -m generic_matrix` runs them).
    The families run every test; a type picked by VLM_GRPO_CONTRACT_TYPES (a measurement) runs every test too."""
    if os.environ.get("VLM_GRPO_CONTRACT_TYPES"):
        return
    contract = [item for item in items if item.nodeid.startswith("tests/adapters/test_contract.py::")]
    tests = sorted({item.originalname for item in contract})
    types = sorted({t for t in contract_types() if t not in _families()})
    for item in contract:
        kind = getattr(getattr(item, "callspec", None), "params", {}).get("adapter")
        if kind in types and (tests.index(item.originalname) + types.index(kind)) % 2:
            item.add_marker(pytest.mark.generic_matrix)


def pytest_collection_modifyitems(config, items):
    _longest_files_first(items)
    _generic_types_in_turn(items)
    slow = _slow(items, config)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in set(slow)]
    chosen = config.getoption("-m") or ""
    for name in OPT_IN_MARKERS:
        if name in chosen:
            continue
        deselected = [item for item in items if name in item.keywords]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if name not in item.keywords]
