"""Outputs written where the user points (`save_model(dir)`, `eval --out`, `report --out`, `audit-rewards --json`,
`compose --out`, `convert-gguf --out`):
the run directory's rule holds there too. Only what this program wrote is replaced; anything else found at that path
is moved aside (never overwritten, never deleted) and the message names both paths.

- `write_output(path, data)`: one whole file. In a run directory (it has `.vlm-grpo-files.json`) the run's own file
  is replaced and the new one listed as the run's; elsewhere, or for a file the run did not write, an existing file
  is first renamed to `NAME.replaced-<UTC time>`.
- `saved_folder(out)`: the same for a command's output folder (`compose --out`, `convert-gguf --out`).
- `commit_folder(staging, out)`: a folder written whole in `staging` (beside `out`) renamed into place. An empty
  folder, or an earlier save of this program (a `manifest.json` that lists every file in it, each of the size
  recorded), is replaced; a folder holding anything else is moved aside the same way. Into a run directory (a TRL
  script's `save_model(output_dir)`) the files go one by one: the run's own replaced, any other moved aside.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator

from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.checkpoint.manifest import MANIFEST, write_manifest


def aside_path(path: Path) -> Path:
    """A free name beside `path` for what was there: NAME.replaced-<UTC time>[-N]."""
    return safe_files.dated_free_name(path.parent, f"{path.name}.replaced-")


def _move_aside(path: Path, what: str) -> str:
    target = aside_path(path)
    os.rename(path, target)  # a rename: the same bytes, under another name
    return f"{path} held {what} this program did not write: moved it to {target} (nothing was overwritten)"


def write_output(path: str | Path, data: bytes | str) -> tuple[Path, str | None]:
    """`data` as the file `path`; returns (path, the note to print when something was moved aside, else None)."""
    path = Path(path)
    safe_files.check_path(path)
    if path.is_dir() and not path.is_symlink():
        raise ValueError(f"{path} is a folder: give a file name")
    listed = safe_files.CreatedFiles(path.parent)
    own = listed.exists and path.name in listed.names()
    note = _move_aside(path, "a file") if os.path.lexists(path) and not own else None
    path.parent.mkdir(parents=True, exist_ok=True)
    if listed.exists:
        return safe_files.write_run_file(path.parent, path.name, data), note
    return safe_files.write_file(path, data), note


def earlier_save(folder: Path) -> bool:
    """Whether `folder` holds only what an earlier save wrote: its manifest lists every file, at its size."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    found = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            p = Path(root) / name
            if p.is_symlink() or (not p.is_dir() and not p.is_file()):
                return False
            if p.is_file() and p.name != MANIFEST:
                found[str(p.relative_to(folder))] = p.stat().st_size
    return isinstance(files, dict) and found == {k: v.get("size") for k, v in files.items() if isinstance(v, dict)}


def staging_for(out: Path) -> Path:
    """A fresh folder beside `out` a save writes into before `commit_folder`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return safe_files.fresh_dir(out.parent / f".tmp-save-{out.name}-{os.getpid()}")


def commit_folder(staging: Path, out: Path) -> str | None:
    """`staging` renamed to `out`; returns the note when what was at `out` was moved aside."""
    out = Path(out)
    safe_files.check_path(out)
    if safe_files.CreatedFiles(out).exists:  # a run directory (TRL scripts save into output_dir): file by file
        return _merge_into_run(staging, out)
    note = None
    if os.path.lexists(out):
        if not out.is_dir():
            note = _move_aside(out, "a file")
        elif not any(out.iterdir()) or earlier_save(out):
            safe_files.remove(out)
        else:
            held = sorted(p.name for p in out.iterdir())
            note = _move_aside(out, f"files ({', '.join(held[:4])}{' ...' if len(held) > 4 else ''})")
    os.rename(staging, out)
    return note


@contextlib.contextmanager
def saved_folder(out: str | Path) -> Iterator[Path]:
    """A fresh folder beside `out` for the caller to fill (`compose --out`, `convert-gguf --out`); then listed in a
    manifest (so the next save there knows it as this program's) and put in place by `commit_folder`, the note
    printed. A failure leaves `out` as it was and removes the unfinished folder."""
    out = Path(out)
    safe_files.check_path(out)
    staging = staging_for(out)
    try:
        yield staging
        write_manifest(staging)
        note = commit_folder(staging, out)
    except BaseException:
        safe_files.remove(staging)
        raise
    if note:
        print(note)


def _merge_into_run(staging: Path, run_dir: Path) -> str | None:
    """Each saved entry renamed into the run directory and listed as the run's: an entry of the run's own replaced,
    anything else there moved aside."""
    listed = safe_files.CreatedFiles(run_dir)
    mine = listed.names()
    notes = []
    for entry in sorted(staging.iterdir()):
        target = run_dir / entry.name
        safe_files.check_path(target)
        if os.path.lexists(target):
            if entry.name in mine:
                safe_files.remove(target)
            else:
                notes.append(_move_aside(target, "a file" if not target.is_dir() else "a folder"))
        listed.add(entry.name)
        os.rename(entry, target)
        listed.record(entry.name)
    staging.rmdir()
    return "; ".join(notes) or None
