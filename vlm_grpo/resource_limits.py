"""A resource that ran out, said in one line: which one, its limit (`resource.getrlimit`), the path, what to do.

The one mapping from a failure to its resource: an OSError's errno (ENOSPC disk full, EDQUOT quota, EFBIG the
file-size limit `ulimit -f`, EMFILE the open-file limit `ulimit -n`, ENFILE the system's file table, ENOMEM), a
MemoryError, a library's .so that could not be mapped under the address-space limit (`ulimit -v`: an ImportError),
and the writers that say the same in their own words (torch's zip writer, safetensors' Rust I/O errors, torch's CPU
allocator). The CLI's top level and the checkpoint writer both ask `explain`. Sizes are written by `size_text`, in
the unit (bytes, KB, MB, GB) that shows them. Only the standard library here: the CLI imports it before anything.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import signal
import threading
from pathlib import Path

RESOURCES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.ENOMEM)
# the C library's words for each (longest first: "Too many open files" is inside "... in system")
_WORDS = sorted(((os.strerror(code), code) for code in RESOURCES), key=lambda w: -len(w[0]))
_ERRNO_IN_TEXT = re.compile(r"(?:os error|code:)\s*(\d+)")  # Rust's I/O errors (safetensors): Display and Debug
_OUT_OF_MEMORY_WORDS = ("can't allocate memory", "failed to map segment from shared object", "std::bad_alloc",
                        "cannot allocate memory")
# torch.save's zip writer names no errno: a full disk or the file-size limit, told apart by the files written
WRITER_WORDS = ("inline_container.cc", "PytorchStreamWriter failed writing", "file write failed", "unexpected pos")
_TEXT_TYPES = (RuntimeError, OSError, ValueError, ImportError)  # errors whose text may carry a resource's words


class ResourceLimitReached(OSError):
    """A write, an open or an allocation refused for want of a resource, as one line (str() is that line)."""

    def __init__(self, code: int, line: str, path: Path | str | None = None):
        super().__init__(code, line, None if path is None else str(path))
        self.line = line

    def __str__(self) -> str:
        return self.line


def writes_past_the_file_size_limit_fail() -> None:
    """SIGXFSZ ignored (Python's own start does so; an embedding interpreter may not): a write past `ulimit -f` then
    fails with EFBIG, which a save turns into one line, instead of the signal killing the process mid-checkpoint."""
    if hasattr(signal, "SIGXFSZ") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def size_text(n: int | float, unit: str | None = None) -> str:
    """`n` bytes in the unit that shows it (or in `unit`): 512 bytes, 4.1 KB, 12.0 MB, 3.25 GB (decimal units)."""
    n = float(n)
    unit = unit or ("bytes" if abs(n) < 1e3 else "KB" if abs(n) < 1e6 else "MB" if abs(n) < 1e9 else "GB")
    if unit == "bytes":
        return f"{int(n)} bytes"
    scale = {"KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    return f"{n / scale:.2f} GB" if unit == "GB" else f"{n / scale:.1f} {unit}"


def size_pair(need: int | float, free: int | float) -> tuple[str, str]:
    """Two sizes in one unit, the one that shows the smaller; in bytes when that unit would write them alike."""
    unit = size_text(min(need, free)).split()[-1]
    a, b = size_text(need, unit), size_text(free, unit)
    if a == b and int(need) != int(free):
        a, b = size_text(need, "bytes"), size_text(free, "bytes")
    return a, b


def soft_limit(kind: int) -> int | None:
    """The soft limit of `kind` (a resource.RLIMIT_*), None when unlimited."""
    soft = resource.getrlimit(kind)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def _mapped_peak() -> int | None:
    """The most address space this process had mapped (VmPeak), None where /proc does not say."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _open_files() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself holds
    except OSError:  # at the limit listing takes a descriptor too: ask each one below it
        pass
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft > 1 << 16:
        return None
    held = 0
    for fd in range(soft):
        try:
            os.fstat(fd)
            held += 1
        except OSError:
            continue
    return held


def oversized_file(folder: Path) -> Path | None:
    """A file under `folder` that reached the file-size limit (the write that failed), None when none did."""
    limit = soft_limit(resource.RLIMIT_FSIZE)
    if limit is None or not Path(folder).is_dir():
        return None
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            try:
                if path.stat().st_size >= limit:
                    return path
            except OSError:
                continue
    return None


def _errno_of(err: BaseException, written: Path | None) -> int | None:
    if isinstance(err, MemoryError):
        return errno.ENOMEM
    if isinstance(err, OSError) and err.errno is not None:
        return err.errno if err.errno in RESOURCES else None
    if not isinstance(err, _TEXT_TYPES) and type(err).__name__ != "SafetensorError":
        return None
    text = str(err)
    for match in _ERRNO_IN_TEXT.finditer(text):
        if int(match.group(1)) in RESOURCES:
            return int(match.group(1))
    for words, code in _WORDS:
        if words in text:
            return code
    if any(w in text.lower() for w in _OUT_OF_MEMORY_WORDS):
        return errno.ENOMEM
    if isinstance(err, ImportError):
        return None
    if any(w in text for w in WRITER_WORDS):
        if soft_limit(resource.RLIMIT_FSIZE) is not None and (written is None or oversized_file(written)):
            return errno.EFBIG
        return errno.ENOSPC
    return None


def cause(err: BaseException, written: Path | None = None) -> tuple[BaseException, int] | None:
    """The error in `err`'s chain (itself first, then what it was raised from or during) that a resource ran out
    for, with that resource's errno; None when none did. `written`: the folder a failed write was writing into."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen and len(seen) < 16:
        seen.add(id(err))
        code = _errno_of(err, written)
        if code is not None:
            return err, code
        err = err.__cause__ or err.__context__
    return None


def _library(err: BaseException) -> str | None:
    """The shared object an ImportError could not map (its message starts with the file's name)."""
    if not isinstance(err, ImportError):
        return None
    head = str(err).split(":", 1)[0].strip()
    return head if head.endswith(".so") or ".so." in head else (err.path or err.name)


def _memory_line(err: BaseException, where: str) -> tuple[str, str]:
    peak = _mapped_peak()
    had = f"; the process had {size_text(peak)} mapped" if peak is not None else ""
    smaller = "a smaller model or data.batch_size" if not where.startswith(" loading") else None
    for kind, name, flag in ((resource.RLIMIT_AS, "address-space", "-v"), (resource.RLIMIT_DATA, "data-size", "-d")):
        limit = soft_limit(kind)
        if limit is not None:  # torch and transformers alone map about 3.3 GB of address space
            return (f"{name} limit (ulimit {flag}) of {size_text(limit)} reached{where}{had}",
                    f"raise it (ulimit {flag} unlimited{'' if smaller else '; torch alone maps a few GB'})"
                    + (f" or use {smaller}" if smaller else ""))
    try:
        with open("/proc/meminfo") as fh:
            free = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
        free_text = f", {size_text(free)} of memory available"
    except (OSError, StopIteration, ValueError, IndexError):
        free_text = ""
    return f"out of memory{where} ({type(err).__name__}){had}{free_text}", \
        f"use {smaller}, or free memory" if smaller else "free memory"


def _disk_free(path: Path | None) -> str:
    probe = Path(path) if path is not None else Path.cwd()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return f", {size_text(shutil.disk_usage(probe).free)} free"
    except OSError:
        return ""


def parts(err: BaseException, code: int, path: Path | str | None = None) -> tuple[str, str]:
    """(what ran out, naming its limit and the path; what to do) for `err`, which ran out of resource `code`."""
    path = path if path is not None else getattr(err, "filename", None)
    if code == errno.EFBIG:
        limit = soft_limit(resource.RLIMIT_FSIZE)
        target = f" writing {path}" if path else ""
        if limit is None:
            return f"file too large for its file system{target}", "write it to another file system (--output-dir)"
        return (f"file-size limit (ulimit -f) reached{target}: no file may be larger than {size_text(limit)}",
                "raise it (ulimit -f unlimited)")
    if code == errno.ENOSPC:
        return f"disk full{f' writing {path}' if path else ''}{_disk_free(Path(path) if path else None)}", \
            "free some space, or choose another --output-dir"
    if code == errno.EDQUOT:
        return f"disk quota exceeded{f' writing {path}' if path else ''}", \
            "free some space within your quota, or choose another --output-dir"
    if code == errno.EMFILE:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held = _open_files()
        count = f" and holds {held}" if held is not None else ""
        allows = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        return (f"open-file limit (ulimit -n) reached{f' opening {path}' if path else ''}: the process may hold "
                f"{allows} open files{count}",
                f"raise it (ulimit -n {'unlimited' if hard == resource.RLIM_INFINITY else hard})")
    if code == errno.ENFILE:
        return f"the system's open-file table is full{f' opening {path}' if path else ''}", \
            "close other programs, or raise fs.file-max"
    library = _library(err)
    where = f" loading {library}" if library else f" writing {path}" if path else ""
    return _memory_line(err, where)


def explain(err: BaseException, path: Path | str | None = None, kept: str = "", then: str = "",
            written: Path | None = None) -> str | None:
    """One line for `err` when a resource ran out in it or in what it was raised from (None otherwise): the resource,
    its limit and the path; `kept` (what was kept); what to do, then `then`. A wrapping error's own words come first."""
    found = cause(err, written)
    return None if found is None else line_for(err, found, path, kept, then)


def line_for(err: BaseException, found: tuple[BaseException, int], path: Path | str | None = None, kept: str = "",
             then: str = "") -> str:
    """`explain`'s line for `err` whose `cause` is `found` (found once, before the files it looked at are gone)."""
    inner, code = found
    if isinstance(inner, ResourceLimitReached) and not (kept or then) and path is None:
        line = inner.line
    else:
        what, fix = parts(inner, code, path)
        line = "; ".join(p for p in (what, kept, f"{fix}, then {then}" if then else fix) if p)
    return line if inner is err else f"{err}; {line}"


def reached(err: BaseException, path: Path | str | None = None) -> ResourceLimitReached | None:
    """`explain`'s line as an error to raise (None when no resource ran out)."""
    found = cause(err)
    return None if found is None else ResourceLimitReached(found[1], line_for(err, found, path), path)
