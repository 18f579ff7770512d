"""Every file a run writes in its directory goes through here: created fresh, moved into place atomically, never
opened through a symlink or a file with other hard links, and listed in the run's own record of what it created.

- `refuse_links(run_dir)`: a symlink or a hard-linked file where a run file or folder goes (or anywhere inside a run
  folder) is refused with exit 2, naming the path and where it points. Called on start and on resume, before the
  lock file is opened.
- `write_file` / `append_file`: a whole file is written to a fresh temp file (O_EXCL | O_NOFOLLOW) beside it and
  renamed over it; an append opens with O_NOFOLLOW and refuses a file with other links.
- `fresh_dir`: a staging folder (`.tmp-*`) removed and made again, never reused through a link.
- `CreatedFiles`: `.vlm-grpo-files.json`, the top-level names the run created. A run deletes or rewrites only those:
  a user's file that happens to carry a run file's name is never touched.
- `read_run_file(run_dir, relative)`: what report.html, the trackers and the model card read back from a run
  (images, charts): a path inside the run directory, reached through no link and no hard-linked file; anything else
  (`/etc/...`, `../`, a symlinked `attention.png`) is refused with `OutsideRun`, naming why, and left out.
- Disk full (ENOSPC) while writing becomes `DiskFull`: the path, the space needed and the space free, in one line.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Iterable

from vlm_grpo.grpo.setting_fields import SettingError

CREATED_LIST = ".vlm-grpo-files.json"  # the run's record of the top-level entries it created
STAGING_PREFIX = ".tmp-write-"  # a whole-file write in progress (left only by a kill: removed at the next start)


class UnsafeRunPath(SettingError):
    """A link where a run file or folder goes (exit 2)."""

    def __init__(self, path: Path, problem: str):
        super().__init__("logging.output_dir", f"{path} {problem}: a run never writes through links; remove it or "
                         "choose another --output-dir")


class OutsideRun(ValueError):
    """A path read back from a run that is not one of the run's own files."""


class DiskFull(OSError):
    """ENOSPC while writing a run file, said in one line."""


def link_problem(path: Path) -> str | None:
    """Why `path` may not be written through (None: absent, a plain file with one link, or a real folder)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"is a symlink to {os.readlink(path)}"
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_nlink > 1:
        return f"is a hard-linked file ({st.st_nlink} links: another name shares its contents)"
    return None


def check_path(path: Path) -> None:
    problem = link_problem(path)
    if problem:
        raise UnsafeRunPath(path, problem)


def check_tree(path: Path) -> None:
    """`path` and, for a real folder, everything under it."""
    check_path(path)
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):  # os.walk never follows a symlinked folder
            for name in dirs + files:
                check_path(Path(root) / name)


def refuse_links(run_dir: Path, names: Iterable[str]) -> None:
    """Every top-level entry of `run_dir` in `names` (a run file or folder) checked, folders through."""
    for name in sorted(set(names)):
        check_tree(Path(run_dir) / name)


def _disk_full(path: Path, need: int | None) -> DiskFull:
    try:
        free = shutil.disk_usage(path.parent if not path.is_dir() else path).free
    except OSError:
        free = None
    needed = f"about {need / 1e6:.1f} MB" if need is not None else "more space"
    text = f"disk full while writing {path}: it needs {needed}"
    if free is not None:
        text += f", {free / 1e6:.1f} MB are free"
    return DiskFull(errno.ENOSPC, text + "; free some space, or choose another --output-dir")


def write_file(path: Path, data: bytes | str) -> Path:
    """`data` written whole to a fresh file beside `path`, then renamed over it (never through a link)."""
    path = Path(path)
    check_path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f"{STAGING_PREFIX}{path.name}-{os.getpid()}")
    remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        check_path(path)  # again: nothing swapped in a link meanwhile
        os.replace(tmp, path)
    except OSError as err:
        remove(tmp)
        if err.errno == errno.ENOSPC:
            raise _disk_full(path, len(raw)) from None
        raise
    return path


def append_file(path: Path, text: str) -> None:
    """`text` appended to `path` (created when absent); never through a symlink or a file with other links."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeRunPath(path, f"is a symlink to {os.readlink(path)}") from None
        raise
    with os.fdopen(fd, "a") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise UnsafeRunPath(path, link_problem(path) or "is not a regular file")
        try:
            fh.write(text)
            fh.flush()
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise _disk_full(path, len(text.encode())) from None
            raise


def remove(path: Path) -> None:
    """`path` removed without following it: a symlink goes, never what it points to."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: a symlink inside is removed, its target left alone
    else:
        path.unlink()


def fresh_dir(path: Path) -> Path:
    """An empty folder at `path`, made now (whatever was there removed, a link included, never followed)."""
    path = Path(path)
    remove(path)
    os.mkdir(path)
    return path


class CreatedFiles:
    """The top-level entries a run created in its directory (`.vlm-grpo-files.json`)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / CREATED_LIST

    @property
    def exists(self) -> bool:
        return self.path.is_file() and not self.path.is_symlink()

    def names(self) -> set[str]:
        if not self.exists:
            return set()
        check_path(self.path)
        try:
            data = json.loads(self.path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise SettingError("logging.output_dir", f"{self.path} is not the run's list of files ({err})") from None
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, list) or not all(_plain_name(n) for n in files):
            raise SettingError("logging.output_dir", f"{self.path}: `files` must be a list of names in the run "
                               "directory (no folders, no '..')")
        return set(files)

    def save(self, names: Iterable[str]) -> None:
        write_file(self.path, json.dumps({"files": sorted(set(names))}, indent=1) + "\n")

    def add(self, *names: str) -> None:
        known = self.names()
        if not set(names) <= known or not self.exists:
            self.save(known | set(names))

    def discard(self, *names: str) -> None:
        known = self.names()
        if known & set(names):
            self.save(known - set(names))


def _plain_name(name) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and "\\" not in name and name not in (".", "..")


def top_name(run_dir: Path, path: Path) -> str:
    return Path(path).relative_to(run_dir).parts[0]


def write_run_file(run_dir: Path, name: str, data: bytes | str) -> Path:
    """A whole top-level run file (config.yaml, eval-*.json ...), written safely and recorded as the run's."""
    CreatedFiles(run_dir).add(name)
    return write_file(Path(run_dir) / name, data)


def append_run_file(run_dir: Path, name: str, text: str) -> None:
    CreatedFiles(run_dir).add(name)
    append_file(Path(run_dir) / name, text)


def write_run_path(run_dir: Path, relative: str, data: bytes | str) -> Path:
    """A whole file at `relative` inside the run directory (e.g. completions/images/x.png): its top-level entry
    recorded as the run's, each folder on the way made or checked (never a link), then written as `write_file`."""
    run_dir = Path(run_dir)
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise ValueError(f"{relative!r} is not a path inside the run directory")
    CreatedFiles(run_dir).add(parts[0])
    folder = run_dir
    for part in parts[:-1]:
        folder = folder / part
        check_path(folder)
        if not folder.is_dir():
            os.mkdir(folder)
    return write_file(run_dir / relative, data)


def run_file(run_dir: Path, relative: str | Path) -> Path:
    """`relative` inside `run_dir`, every step of the way a real folder and at its end a plain file with one link;
    else OutsideRun saying why."""
    run_dir = Path(run_dir)
    rel = Path(str(relative))
    if not str(relative) or rel.is_absolute() or ".." in rel.parts or str(relative).startswith("~"):
        raise OutsideRun(f"{relative} is not a path inside the run directory")
    path = run_dir
    for part in rel.parts:
        path = path / part
        try:
            st = os.lstat(path)
        except OSError:
            raise OutsideRun(f"{relative} is not in the run directory") from None
        if stat.S_ISLNK(st.st_mode):
            raise OutsideRun(f"{relative} goes through a symlink ({path.relative_to(run_dir)} -> {os.readlink(path)})")
    if not stat.S_ISREG(st.st_mode):
        raise OutsideRun(f"{relative} is not a regular file")
    if st.st_nlink > 1:
        raise OutsideRun(f"{relative} is a hard-linked file ({st.st_nlink} links: it may be a file from outside the run)")
    return path


def read_run_file(run_dir: Path, relative: str | Path, max_bytes: int = 64 * 2**20) -> bytes:
    """The bytes of the run's own file `relative` (run_file's rule, checked again on the open file)."""
    path = run_file(run_dir, relative)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise OutsideRun(f"{relative} changed into a link while it was read")
        if st.st_size > max_bytes:
            raise OutsideRun(f"{relative} is {st.st_size / 1e6:.0f} MB, above {max_bytes / 1e6:.0f} MB")
        return fh.read(max_bytes + 1)[:max_bytes]
