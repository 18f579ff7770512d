"""Code a model directory ships (config.json's `auto_map`: Python files transformers would import): refused unless
the caller passed `--trust-remote-code` (or `trust_remote_code=True` in Python), announced in one warning when it
will run. transformers itself asks y/N on stdin when the flag is left unset; every call here passes it explicitly,
so no command ever waits on a prompt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FLAG = "--trust-remote-code"


def shipped_code(path: str | Path) -> list[str]:
    """The classes a local model directory's config.json maps to its own code (`auto_map`); [] for none, or for a
    hub id (not read here: offline, transformers decides with the flag as given)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return []
    try:
        auto_map = json.loads(config.read_text()).get("auto_map") or {}
    except (ValueError, AttributeError):
        return []
    values = auto_map.values() if isinstance(auto_map, dict) else []
    return sorted({v if isinstance(v, str) else ", ".join(map(str, v)) for v in values})


def check_remote_code(name: str | Path, trust: bool, what: str = "the model") -> None:
    """Before transformers reads `name`: a directory shipping code is refused without `trust` (naming the flag);
    with `trust`, one warning says whose code runs."""
    code = shipped_code(name)
    if code and not trust:
        raise ValueError(f"{what} {name} ships its own Python code ({'; '.join(code)[:200]}), which would run "
                              f"when loaded: pass {FLAG} to run it (only for a source you trust), or use a model "
                              "without custom code")
    if trust:
        runs = f"its code ({'; '.join(code)[:200]})" if code else "any code it ships"
        print(f"warning: {FLAG}: loading {what} {name} runs {runs} with your permissions", file=sys.stderr)
