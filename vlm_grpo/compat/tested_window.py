"""The tested window of our dependencies, and a warning when the installed ones lie outside it.

The oldest version tested of each dependency is its lower bound in pyproject.toml (read back from the installed
package's metadata), which is also what requirements.lock holds; the newest tested is written to
`tested_window.json` (beside this file) by `make test-latest` after a green run on the newest releases. A version
outside that window is not refused: transformers releases move fast and users install the newest. The KV-cache
probe still runs at load and decides what generation may use; this only says that nobody has run our suite on it.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

WINDOW_FILE = Path(__file__).with_name("tested_window.json")
DISTRIBUTION = "vlm-grpo"
log = logging.getLogger(__name__)
_warned: set[str] = set()


@lru_cache(maxsize=None)
def oldest_tested() -> dict[str, str]:
    """Package -> its lower bound in our own metadata (the core dependencies, extras left out)."""
    try:
        declared = requires(DISTRIBUTION) or []
    except PackageNotFoundError:  # running from a source tree that was never installed
        return {}
    floors = {}
    for line in declared:
        req = Requirement(line)
        if req.marker is not None:  # an extra's
            continue
        for spec in req.specifier:
            if spec.operator == ">=":
                floors[_canonical(req.name)] = spec.version
    return floors


@lru_cache(maxsize=None)
def newest_tested() -> dict[str, str]:
    """Package -> the newest version the whole suite passed on (`make test-latest`)."""
    if not WINDOW_FILE.is_file():
        return {}
    return dict(json.loads(WINDOW_FILE.read_text()).get("newest", {}))


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def outside_window() -> list[str]:
    """One line per installed core dependency outside the tested window, naming the package."""
    lines = []
    newest = {_canonical(k): v for k, v in newest_tested().items()}
    for package, floor in sorted(oldest_tested().items()):
        have = installed(package)
        if have is None:
            continue
        try:
            got = Version(have)
        except InvalidVersion:
            continue
        if got < Version(floor):
            lines.append(f"{package} {have} is older than the oldest tested ({floor})")
        elif package in newest and got > Version(newest[package]):
            lines.append(f"{package} {have} is newer than the newest tested ({newest[package]})")
    return lines


def warn_outside_window() -> list[str]:
    """Log each package outside the window once per process; returns the lines logged now."""
    fresh = [line for line in outside_window() if line not in _warned]
    for line in fresh:
        _warned.add(line)
        log.warning("%s: untested here, the cache probe still decides what generation may use "
                    "(docs/compatibility.md lists the tested versions)", line)
    return fresh


def window_lines() -> list[str]:
    """`package: installed (tested oldest .. newest)` for each core dependency, for `vlm-grpo env`."""
    newest = {_canonical(k): v for k, v in newest_tested().items()}
    lines = []
    for package, floor in sorted(oldest_tested().items()):
        have = installed(package) or "not installed"
        lines.append(f"  {package}: {have} (tested {floor} .. {newest.get(package, floor)})")
    return lines
