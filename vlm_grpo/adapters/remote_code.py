"""Code a model directory ships (the `auto_map` of its config.json, tokenizer, processor or image-processor config:
Python files transformers would import): refused unless the caller passed `--trust-remote-code` (or
`trust_remote_code=True` in Python), announced in one warning when it will run. transformers itself asks y/N on stdin
when the flag is left unset; every load passes it explicitly and comes here first, so no command ever waits on a
prompt and a refusal names the folder and its code, not whatever transformers would have failed on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

FLAG = "--trust-remote-code"


# every file of a model folder whose `auto_map` transformers follows (the model, tokenizer, processor, image and
# video processors, feature extractor)
CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
                "image_processor_config.json", "video_preprocessor_config.json", "feature_extractor_config.json")


def _auto_map(file: Path) -> list[str]:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    auto_map = data.get("auto_map") if isinstance(data, dict) else None
    if isinstance(auto_map, dict):
        values = list(auto_map.values())
    elif isinstance(auto_map, list):
        values = auto_map
    else:
        return [] if auto_map in (None, "", {}) else [str(auto_map)]
    return [v if isinstance(v, str) else ", ".join(map(str, v)) for v in values]


def shipped_code(path: str | Path) -> list[str]:
    """The classes a local model directory maps to its own code (`auto_map` in any of CONFIG_FILES); [] for none,
    or for a hub id (not read here: offline, transformers decides with the flag as given)."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    return sorted({code for name in CONFIG_FILES if (folder / name).is_file() for code in _auto_map(folder / name)})


def check_remote_code(name: str | Path, trust: bool, what: str = "the model", flag: str | None = FLAG) -> None:
    """Before transformers reads `name`: a directory shipping code is refused without `trust` (naming the flag, or
    for a command that never runs such code, `flag=None`, saying so); with `trust`, one warning says whose code runs."""
    code = shipped_code(name)
    if code and not trust:
        how = (f"pass {flag} to run it (only for a source you trust), or use a model without custom code" if flag
               else "this command runs no shipped code: give it a folder without such files")
        raise ValueError(f"{what} {name} ships its own Python code ({'; '.join(code)[:200]}), which would run "
                         f"when loaded: {how}")
    if trust:
        runs = f"its code ({'; '.join(code)[:200]})" if code else "any code it ships"
        print(f"warning: {FLAG}: loading {what} {name} runs {runs} with your permissions", file=sys.stderr)
