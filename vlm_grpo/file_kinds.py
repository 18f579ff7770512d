"""What a path names when it is not a regular file, so a message says "is a directory" or "is a named pipe" instead
of calling it missing (and nothing blocks opening a FIFO or reads a device without end)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(path: str | os.PathLike) -> str | None:
    """'a directory', 'a named pipe (FIFO)', 'a character device', 'a block device' or 'a socket' (links followed);
    None for a regular file or a path that does not exist."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((name for test, name in KINDS if test(mode)), None)


def not_a_file(path: str | os.PathLike, noun: str = "file") -> str | None:
    """Why `path` cannot be read as a `noun` (None: it is a regular file): 'no such file: P' or 'P is a directory,
    not a file'."""
    kind = special_kind(path)
    if kind is not None:
        return f"{path} is {kind}, not {'an' if noun[0] in 'aeiou' else 'a'} {noun}"
    if not Path(path).is_file():
        return f"no such {noun}: {path}"
    return None


def not_a_folder(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be a folder to write into (None: it is one, or it and its missing parents can be made):
    'P is a file, not a folder', or the same of the first parent on its way that is not a folder."""
    for part in [Path(path), *Path(path).parents]:
        if not os.path.lexists(part) or part.is_dir():
            continue
        kind = special_kind(part) or "a file"
        where = "" if part == Path(path) else f" (on the way to {path})"
        return f"{part} is {kind}, not a folder{where}"
    return None
