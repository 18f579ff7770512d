"""Every file a run writes in its directory goes through here: created fresh, moved into place atomically, never
opened through a symlink or a file with other hard links, and listed in the run's own record of what it created.

- `refuse_links(run_dir)`: a symlink or a hard-linked file where a run file or folder goes (or anywhere inside a run
  folder) is refused with exit 2, naming the path and where it points. Called on start and on resume, before the
  lock file is opened.
- `write_file` / `append_file`: a whole file is written to a fresh temp file (O_EXCL | O_NOFOLLOW) beside it and
  renamed over it; an append opens with O_NOFOLLOW and refuses a file with other links.
- `fresh_dir`: a staging folder (`.tmp-*`) removed and made again, never reused through a link.
- `CreatedFiles`: `.vlm-grpo-files.json`, the top-level names the run created, each with the inode it wrote. A run
  deletes or rewrites only those that still match: a user's file that happens to carry a run file's name, or one a
  shipped list names, is never touched.
- `read_run_file(run_dir, relative)`: what report.html, the trackers and the model card read back from a run
  (images, charts): a path inside the run directory, reached through no link and no hard-linked file; anything else
  (`/etc/...`, `../`, a symlinked `attention.png`) is refused with `OutsideRun`, naming why, and left out.
- Disk full (ENOSPC) while writing becomes `DiskFull`: the path, the space needed and the space free, in one line;
  another resource running out (a quota, `ulimit -f`, `ulimit -n`) becomes `ResourceLimitReached`, naming its limit.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Iterable

from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.resource_limits import ResourceLimitReached, reached, size_pair, size_text

CREATED_LIST = ".vlm-grpo-files.json"  # the run's record of the top-level entries it created
STAGING_PREFIX = ".tmp-write-"  # a whole-file write in progress (left only by a kill: removed at the next start)


class UnsafeRunPath(SettingError):
    """A link where a run file or folder goes (exit 2)."""

    def __init__(self, path: Path, problem: str):
        super().__init__("logging.output_dir", f"{path} {problem}: a run never writes through links; remove it or "
                         "choose another --output-dir")


class OutsideRun(ValueError):
    """A path read back from a run that is not one of the run's own files."""


class DiskFull(ResourceLimitReached):
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


def make_dirs_below(root: Path, folder: Path) -> Path:
    """`folder` (inside `root`) made one level at a time, refusing a link at any level below `root`: `mkdir(parents=
    True, exist_ok=True)` would go through a planted symlinked folder without a word. `root` itself is the user's."""
    root, folder = Path(root), Path(folder)
    here = root
    root.mkdir(parents=True, exist_ok=True)
    for part in folder.relative_to(root).parts:
        here = here / part
        check_path(here)
        here.mkdir(exist_ok=True)
        check_path(here)  # again: nothing swapped in a link meanwhile
    return folder


def check_below(root: Path, path: Path) -> None:
    """Every existing level of `path` below `root` checked (nothing made)."""
    here = Path(root)
    for part in Path(path).relative_to(root).parts:
        here = here / part
        check_path(here)


def write_below(root: Path, path: Path, data: bytes | str) -> Path:
    """`write_file` of `path`, its folders inside `root` made by `make_dirs_below`."""
    make_dirs_below(root, Path(path).parent)
    return write_file(path, data)


def refuse_links(run_dir: Path, names: Iterable[str]) -> None:
    """Every top-level entry of `run_dir` in `names` (a run file or folder) checked, folders through."""
    for name in sorted(set(names)):
        check_tree(Path(run_dir) / name)


def _write_failed(path: Path, need: int | None, err: OSError) -> OSError | None:
    """The one-line error for a write of `path` that a resource refused (None: not a resource's doing)."""
    if err.errno != errno.ENOSPC:
        return reached(err, path)
    try:
        free = shutil.disk_usage(path.parent if not path.is_dir() else path).free
    except OSError:
        free = None
    if need is not None and free is not None:
        needed, free_text = size_pair(need, free)
        text = f"disk full while writing {path}: it needs about {needed}, {free_text} are free"
    else:
        needed = f"about {size_text(need)}" if need is not None else "more space"
        text = f"disk full while writing {path}: it needs {needed}"
        text += f", {size_text(free)} are free" if free is not None else ""
    return DiskFull(errno.ENOSPC, text + "; free some space, or choose another --output-dir", path)


def write_file(path: Path, data: bytes | str) -> Path:
    """`data` written whole to a fresh file beside `path`, then renamed over it (never through a link)."""
    path = Path(path)
    check_path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f"{STAGING_PREFIX}{path.name}-{os.getpid()}")
    remove(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        check_path(path)  # again: nothing swapped in a link meanwhile
        os.replace(tmp, path)
    except OSError as err:
        remove(tmp)
        said = _write_failed(path, len(raw), err)
        if said is not None:
            raise said from None
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
            said = _write_failed(path, len(text.encode()), err)
            if said is not None:
                raise said from None
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


def dated_free_name(parent: Path, prefix: str, when: float | None = None) -> Path:
    """`parent/PREFIX<UTC time>`, or with `-2`, `-3` ... when taken: a name nothing is at (`when`: a timestamp,
    default now)."""
    moment = datetime.datetime.fromtimestamp(when, datetime.timezone.utc) if when is not None else \
        datetime.datetime.now(datetime.timezone.utc)
    stamp = moment.strftime("%Y%m%d-%H%M%S")
    target, n = Path(parent) / f"{prefix}{stamp}", 1
    while os.path.lexists(target):
        n += 1
        target = Path(parent) / f"{prefix}{stamp}-{n}"
    return target


def fresh_dir(path: Path) -> Path:
    """An empty folder at `path`, made now (whatever was there removed, a link included, never followed)."""
    path = Path(path)
    remove(path)
    os.mkdir(path)
    return path


def identity(path: Path) -> dict[str, Any] | None:
    """What a run records of an entry it made: its kind, device and inode, and a file's size and modification time
    (None: absent). A copy, an unpacked archive or a user's file of the same name has another; a file written inside
    a folder keeps the folder's; the run records a file again after each of its own writes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
    if kind != "file":
        return {"kind": kind, "dev": st.st_dev, "ino": st.st_ino}
    # a file's size and time too: a file made later may reuse a removed file's inode number
    return {"kind": kind, "dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


class NotTheRuns(SettingError):
    """An entry the run was about to replace that is not the one it wrote (exit 2)."""

    def __init__(self, path: Path):
        super().__init__("logging.output_dir", f"{path} is not the file this run wrote there (listed in "
                         f"{CREATED_LIST}, but another file or folder now): it is left as it is; move it away or "
                         "choose another --output-dir")


class CreatedFiles:
    """The top-level entries a run created in its directory (`.vlm-grpo-files.json`), each with the identity it had
    when the run wrote it (`identity`). Only an entry that still has it is the run's: a list shipped with a folder,
    or an entry replaced since, names files the run never deletes or replaces (`unverified` names them).

    `add(name)` claims a name before a write (refused when a file the run did not write is there); `record(name)`
    notes what the write made; `settle()` records every claimed entry that now exists (a tracker's folder)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / CREATED_LIST

    @property
    def exists(self) -> bool:
        return self.path.is_file() and not self.path.is_symlink()

    def entries(self) -> dict[str, dict[str, Any] | None]:
        """name -> the identity recorded (None: claimed, not yet recorded; a list of names alone records none)."""
        if not self.exists:
            return {}
        check_path(self.path)
        try:
            data = json.loads(self.path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise SettingError("logging.output_dir", f"{self.path} is not the run's list of files ({err})") from None
        files = data.get("files") if isinstance(data, dict) else None
        if isinstance(files, list):  # a list from before identities were recorded: it vouches for nothing
            files = {name: None for name in files} if all(_plain_name(n) for n in files) else None
        if not isinstance(files, dict) or not all(_plain_name(n) and (v is None or _identity_record(v))
                                                  for n, v in files.items()):
            raise SettingError("logging.output_dir", f"{self.path}: `files` must map names in the run directory (no "
                               "folders, no '..') to what the run wrote there")
        return files

    def _matches(self, name: str, recorded: dict[str, Any] | None) -> bool:
        now = identity(self.run_dir / name)
        return now is None or now == recorded

    def names(self) -> set[str]:
        """The listed names that are the run's: absent, or still the entry the run wrote."""
        return {n for n, v in self.entries().items() if self._matches(n, v)}

    def unverified(self) -> list[str]:
        """Listed names whose entry is not the one the run wrote (shipped with the folder, or replaced since)."""
        return sorted(n for n, v in self.entries().items() if not self._matches(n, v))

    def _write(self, entries: dict[str, dict[str, Any] | None]) -> None:
        write_file(self.path, json.dumps({"files": dict(sorted(entries.items()))}, indent=1) + "\n")

    def save(self, names: Iterable[str]) -> None:
        """The list made anew: `names` (each the run's own), with what is at each now."""
        self._write({n: identity(self.run_dir / n) for n in set(names)})

    def add(self, *names: str) -> dict[str, dict[str, Any] | None]:
        """Claim `names` before writing them: an absent name is listed, the run's own entry kept; an entry the run
        did not write is refused (NotTheRuns), never replaced. Returns the list as it now stands (for `record`)."""
        entries = self.entries()
        changed = not self.exists
        for name in names:
            check_path(self.run_dir / name)  # a link is named as one
            if name in entries and self._matches(name, entries[name]):
                continue
            now = identity(self.run_dir / name)
            if now is not None:
                raise NotTheRuns(self.run_dir / name)
            entries[name] = None
            changed = True
        if changed:
            self._write(entries)
        return entries

    def record(self, *names: str, entries: dict[str, dict[str, Any] | None] | None = None) -> None:
        """What the run just wrote (or renamed) at `names`, recorded as its own (`entries`: the list as `add`
        returned it, not read again)."""
        entries = self.entries() if entries is None else entries
        fresh = {n: identity(self.run_dir / n) for n in names}
        if any(entries.get(n, "missing") != v for n, v in fresh.items()) or not self.exists:
            self._write({**entries, **fresh})

    def settle(self) -> None:
        """Every claimed entry not yet recorded that exists now (made during the run: a tracker's folder) recorded."""
        entries = self.entries()
        pending = [n for n, v in entries.items() if v is None and identity(self.run_dir / n) is not None]
        if pending:
            self.record(*pending)

    def discard(self, *names: str) -> None:
        entries = self.entries()
        if set(entries) & set(names):
            self._write({n: v for n, v in entries.items() if n not in names})


def _identity_record(value) -> bool:
    return isinstance(value, dict) and value.get("kind") in ("dir", "file", "link") and all(
        isinstance(value.get(k), int) and not isinstance(value.get(k), bool) for k in ("dev", "ino"))


def _plain_name(name) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and "\\" not in name and name not in (".", "..")


def write_run_file(run_dir: Path, name: str, data: bytes | str) -> Path:
    """A whole top-level run file (config.yaml, eval-*.json ...), written safely and recorded as the run's."""
    listed = CreatedFiles(run_dir)
    entries = listed.add(name)
    path = write_file(Path(run_dir) / name, data)
    listed.record(name, entries=entries)
    return path


def append_run_file(run_dir: Path, name: str, text: str) -> None:
    listed = CreatedFiles(run_dir)
    entries = listed.add(name)
    append_file(Path(run_dir) / name, text)
    listed.record(name, entries=entries)


def write_run_path(run_dir: Path, relative: str, data: bytes | str) -> Path:
    """A whole file at `relative` inside the run directory (e.g. completions/images/x.png): its top-level entry
    recorded as the run's, each folder on the way made or checked (never a link), then written as `write_file`."""
    run_dir = Path(run_dir)
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute() or ".." in parts:
        raise ValueError(f"{relative!r} is not a path inside the run directory")
    listed = CreatedFiles(run_dir)
    entries = listed.add(parts[0])
    folder = run_dir
    for part in parts[:-1]:
        folder = folder / part
        check_path(folder)
        if not folder.is_dir():
            os.mkdir(folder)
    path = write_file(run_dir / relative, data)
    listed.record(parts[0], entries=entries)
    return path


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
