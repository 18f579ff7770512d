"""One run per run directory: an exclusive lock (filelock's OS lock on `<run_dir>/.run.lock`) held for the whole run.

The lock file also names its holder (process id, host, start time, command line), written once the lock is held
and cleared when it is released. So a second run into the same directory is refused naming the run that holds it,
and a holder that died without releasing (SIGKILL, a lost node) is recognised afterwards: the OS released its
lock with the process, the record it left says who it was, and the next run says it took that stale lock over.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.setting_fields import SettingError

LOCK_FILE = ".run.lock"


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]}


def describe(holder: dict | None) -> str:
    if not holder:
        return "another process (it has not recorded who it is)"
    return (f"process {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')} "
            f"(`{holder.get('command')}`)")


def _parse(text: str) -> dict | None:
    try:
        holder = json.loads(text) if text.strip() else None
    except ValueError:
        return {"pid": "?", "host": "?", "started": "?", "command": f"unreadable lock record {text[:60]!r}"}
    return holder if isinstance(holder, dict) else None


def _refuse_run(run_dir: Path, holder: str) -> Exception:
    return SettingError("logging.output_dir", f"{run_dir} is in use by another run: {holder}; wait for it to end, "
                        "stop it, or choose another --output-dir")


class RunLock:
    """The run directory's lock. `acquire()` raises SettingError when another run holds it; `stale` is the record a
    dead holder left (None: the last holder released it cleanly). Other work that must run alone (an experiment's
    stage) names its own lock file (`path`) and its own refusal (`refuse(run_dir, holder)`, the error to raise)."""

    def __init__(self, run_dir: Path, path: Path | None = None, refuse: Callable[[Path, str], Exception] = _refuse_run):
        self.run_dir = Path(run_dir)
        self.path = Path(path) if path is not None else self.run_dir / LOCK_FILE
        self.refuse = refuse
        self.stale: dict | None = None
        self._lock = FileLock(self.path, timeout=0, preserve_lock_file=True, on_acquired=self._record)

    def _record(self, fd: int) -> None:
        """Runs once the OS lock is held: read what a previous holder left, then write who holds it now."""
        os.lseek(fd, 0, os.SEEK_SET)
        self.stale = _parse(os.read(fd, 1 << 16).decode("utf-8", "replace"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> None:
        if self.held:
            return
        safe_files.check_path(self.path)  # FileLock opens (and truncates) it: never through a link
        try:
            self._lock.acquire()
        except Timeout:
            holder = _parse(self.path.read_text(errors="replace")) if self.path.is_file() else None
            raise self.refuse(self.run_dir, describe(holder)) from None
        except OSError as err:  # (Timeout is an OSError too: caught above)
            if err.errno != errno.ENOSYS:
                raise
            print(f"warning: the filesystem of {self.run_dir} has no file locks: nothing keeps another run out of it")

    def release(self) -> None:
        if not self.held:
            return
        with contextlib.suppress(OSError):  # the directory may be gone; the OS lock is released all the same
            os.truncate(self.path, 0)  # a clean release leaves no record: a record found later means its holder died
        self._lock.release()

    def __del__(self) -> None:  # a run object dropped without finishing: release cleanly, not as a dead holder
        with contextlib.suppress(Exception):
            self.release()

    def stale_note(self) -> str | None:
        if not self.stale:
            return None
        return (f"{self.run_dir}: took over a stale lock: {describe(self.stale)} held this run directory and ended "
                "without releasing it (killed or crashed)")
