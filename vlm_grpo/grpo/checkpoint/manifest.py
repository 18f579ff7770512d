"""Checkpoint manifests: every file's size and sha256, written last inside the atomic rename, so a checkpoint
can be proven whole before anything is loaded from it (a truncated or overwritten file, a missing one)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from vlm_grpo.grpo import safe_files

MANIFEST = "manifest.json"


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, changed: Sequence[str] | None = None) -> Path:
    """Record every file under `directory` (relative names, sizes, sha256); the manifest itself comes last.

    `changed`: an update after a few files were written into a directory that has a manifest (a model card
    beside gigabytes of weights): only those files, and files the manifest lacks or sizes it does not match,
    are hashed again."""
    path = directory / MANIFEST
    known = json.loads(path.read_text())["files"] if changed is not None and path.is_file() else {}
    files = {}
    for p in sorted(directory.rglob("*")):
        if not p.is_file() or p.name == MANIFEST:
            continue
        name, size = str(p.relative_to(directory)), p.stat().st_size
        entry = known.get(name)
        if entry is None or name in changed or entry["size"] != size:
            entry = {"size": size, "sha256": file_digest(p)}
        files[name] = entry
    safe_files.write_file(path, json.dumps({"files": files}, indent=1))
    return path


def verify(directory: Path) -> list[str]:
    """What is wrong with `directory` against its manifest (empty: every recorded file is there, whole)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return [f"{MANIFEST} is missing (the checkpoint was not finished, or predates manifests)"]
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"{MANIFEST} is unreadable ({err})"]
    problems = []
    for name, expected in files.items():
        file = Path(directory) / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size != expected["size"]:
            problems.append(f"{name} has {file.stat().st_size} bytes, the manifest says {expected['size']}")
        elif file_digest(file) != expected["sha256"]:
            problems.append(f"{name} differs from the manifest (sha256), same size: overwritten or corrupted")
    return problems
