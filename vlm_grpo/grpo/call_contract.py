"""What user code may do to the trainer's process, enforced around every user call (grpo/user_calls.py wraps each
one: rewards, tools, environment methods, judges, callbacks, dataset builders, sync or async).

- A fork without exec is harmless: a child that comes back out of the user function (returning or raising) leaves
  at once with `os._exit` (0 when it returned, its `sys.exit` code, 1 when it raised), so it never runs the trainer's
  code; the parent's result is the call's. The child's buffered output is not flushed (it would repeat the parent's).
- Process-wide state the trainer relies on is taken before the call and compared after it (in the thread that ran
  the call, so torch's per-thread grad mode is the call's own; an async function is checked when it finishes):
  - restored, with one warning per function and change naming the function (file:line) and what it changed, where
    the state before can be put back exactly: the working directory, `sys.stdout` / `sys.stderr` replaced by other
    objects, torch's grad mode, default dtype and device, number of threads, deterministic algorithms, anomaly
    detection and float32 matmul precision, and the SIGINT/SIGTERM handlers (so a later signal still saves and
    stops the run; handlers are set and restored in the main thread only);
  - named in an error (`StateBroken`: the call failed) where it cannot: a `sys.stdout` / `sys.stderr` the call
    closed, or its file descriptor closed (every holder of that object, logging and progress bars included, would
    fail later; a closed stream is reopened on its file descriptor so the error can still be shown), a working
    directory that cannot be entered again.
- Out of scope: the random state (each step seeds its own), environment variables, imported modules.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any, Callable

SIGNALS = (signal.SIGINT, signal.SIGTERM)
log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()  # (function, what changed): each warned about once


class StateBroken(Exception):
    """A user call left process-wide state that cannot be put back (the message says what and what to do)."""


def leave_if_forked(parent: int, code: int) -> None:
    """In a child forked inside a user call, coming back out of it: end the child here, before any trainer code."""
    if os.getpid() != parent:
        os._exit(code)


def child_exit_code(err: BaseException) -> int:
    if isinstance(err, SystemExit):
        return err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    return 1


def _torch():
    return sys.modules.get("torch")  # not imported: no torch state to keep (and no import paid for it)


TORCH_STATE = {  # what torch keeps process- (or thread-) wide: how to read it, how to set it back
    "grad mode": ("is_grad_enabled", "set_grad_enabled"),
    "default dtype": ("get_default_dtype", "set_default_dtype"),
    "default device": ("_default_device", "set_default_device"),
    "number of threads": ("get_num_threads", "set_num_threads"),
    "deterministic algorithms": ("are_deterministic_algorithms_enabled", "use_deterministic_algorithms"),
    "anomaly detection": ("is_anomaly_enabled", "set_anomaly_enabled"),
    "float32 matmul precision": ("get_float32_matmul_precision", "set_float32_matmul_precision"),
}


def _default_device(torch) -> Any:
    """The device torch.set_default_device set (None: none was; setting None back removes it, where setting "cpu"
    would leave a device mode on every torch call)."""
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return None if context is None else context.device


def _torch_state(torch) -> dict[str, Any]:
    return {what: _default_device(torch) if read == "_default_device" else getattr(torch, read)()
            for what, (read, _) in TORCH_STATE.items() if read == "_default_device" or hasattr(torch, read)}


def _set_torch(torch, what: str, value: Any) -> None:
    getattr(torch, TORCH_STATE[what][1])(value)


ADVICE = {  # how to get what the call wanted without leaving it set for the trainer
    "working directory": "use absolute paths (or pass cwd= to subprocess) instead of os.chdir",
    "sys.stdout": "use contextlib.redirect_stdout inside the function, which puts it back",
    "sys.stderr": "use contextlib.redirect_stderr inside the function, which puts it back",
    "grad mode": "use `with torch.no_grad():` inside the function",
    "default dtype": "pass dtype= to the tensors it makes",
    "default device": "pass device= to the tensors it makes",
    "number of threads": "leave torch.set_num_threads to the trainer",
    "deterministic algorithms": "leave torch.use_deterministic_algorithms to the trainer",
    "anomaly detection": "use `with torch.autograd.detect_anomaly():` inside the function",
    "float32 matmul precision": "leave torch.set_float32_matmul_precision to the trainer",
    "SIGINT handler": "a handler of its own would swallow the stop a signal asks for (save, then stop)",
    "SIGTERM handler": "a handler of its own would swallow the stop a signal asks for (save, then stop)",
}


def _shown(value: Any) -> str:
    if isinstance(value, signal.Handlers):
        return value.name  # SIG_IGN, SIG_DFL
    text = getattr(value, "__name__", None) if callable(value) else None
    text = text or repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class ProcessState:
    """The process-wide state a user call must leave as it found it, taken in the calling thread."""

    def __init__(self) -> None:
        self.main = threading.current_thread() is threading.main_thread()
        try:
            self.cwd: str | None = os.getcwd()
        except OSError:  # already gone before the call: nothing to hold the call to
            self.cwd = None
        self.streams = {"sys.stdout": sys.stdout, "sys.stderr": sys.stderr}
        self.closed = {name: getattr(s, "closed", False) for name, s in self.streams.items()}
        self.descriptors = {name: _fileno(s) for name, s in self.streams.items()}
        self.open_fds = {name: fd for name, fd in self.descriptors.items() if fd is not None and _is_open(fd)}
        self.handlers = {f"{signal.Signals(sig).name} handler": signal.getsignal(sig) for sig in SIGNALS}
        torch = _torch()
        self.torch = _torch_state(torch) if torch is not None else {}

    def restore(self, who: Callable[[], str]) -> None:
        """Put back what the call changed, warning once per `who()` and change; StateBroken for what cannot be."""
        changed: list[tuple[str, Any, Any]] = []
        broken: list[str] = []
        self._restore_cwd(changed, broken)
        for name, before in self.streams.items():
            now = getattr(sys, name.split(".")[1])
            if now is not before:
                setattr(sys, name.split(".")[1], before)
                changed.append((name, type(before).__name__, type(now).__name__))
            if name in self.open_fds and not _is_open(self.open_fds[name]):
                broken.append(f"closed file descriptor {self.open_fds[name]} ({name}; every later print, log line and "
                              "progress bar would fail): leave it open")
            elif getattr(before, "closed", False) and not self.closed[name]:
                broken.append(f"closed {name} (every later print, log line and progress bar would fail): leave it "
                              f"open; {ADVICE[name]}")
                _reopen(name, before, self.descriptors[name])
        if self.main:  # only the main thread may set handlers (and only there could the call have set them)
            for sig in SIGNALS:
                name = f"{signal.Signals(sig).name} handler"
                now = signal.getsignal(sig)
                if now != self.handlers[name] and self.handlers[name] is not None:
                    signal.signal(sig, self.handlers[name])
                    changed.append((name, self.handlers[name], now))
        torch = _torch()
        if torch is not None and self.torch:
            for what, now in _torch_state(torch).items():
                if now != self.torch[what]:
                    _set_torch(torch, what, self.torch[what])
                    changed.append((what, self.torch[what], now))
        if changed:
            name = who()
            for what, before, now in changed:
                if (name, what) not in _warned:
                    _warned.add((name, what))
                    log.warning("%s changed the %s (%s -> %s) and left it so; put back for the trainer: %s", name, what,
                                _shown(before), _shown(now), ADVICE[what])
        if broken:
            raise StateBroken("; ".join(broken))

    def _restore_cwd(self, changed: list, broken: list) -> None:
        if self.cwd is None:
            return
        try:
            now = os.getcwd()
        except OSError:
            now = None
        if now == self.cwd:
            return
        try:
            os.chdir(self.cwd)
        except OSError as err:
            broken.append(f"left the working directory {self.cwd} unreachable ({err.strerror}): "
                          f"{ADVICE['working directory']}")
            return
        changed.append(("working directory", self.cwd, now or "a removed directory"))


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a file descriptor (a StringIO, a capture)
        return None


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _reopen(name: str, closed: Any, fd: int | None) -> None:
    """A fresh stream on the closed one's file descriptor, so the error about it can still be shown."""
    if fd is None:
        return
    try:
        os.fstat(fd)
        stream = open(fd, "w", encoding=getattr(closed, "encoding", None) or "utf-8", errors="backslashreplace",
                      closefd=False, buffering=1)
    except (OSError, ValueError):
        return
    if type(closed).__name__ == "SafeStream":  # the CLI's: keep control sequences out of what it shows
        from vlm_grpo.terminal import SafeStream

        stream = SafeStream(stream)
    setattr(sys, name.split(".")[1], stream)


def _restore_quietly(before: ProcessState, who: Callable[[], str]) -> None:
    """Restore after a call that raised: its own error is the one to report."""
    try:
        before.restore(who)
    except StateBroken:
        pass


def kept(thunk: Callable[[], Any], who: Callable[[], str], state: bool = True) -> Callable[[], Any]:
    """`thunk` under the contract: a forked child coming back out of it ends at once; with `state`, process-wide
    state is taken before and restored (or named in StateBroken) after, in the thread that runs it."""
    def run() -> Any:
        parent = os.getpid()
        before = ProcessState() if state else None
        try:
            result = thunk()
        except BaseException as err:
            leave_if_forked(parent, child_exit_code(err))
            if before is not None:
                _restore_quietly(before, who)
            raise
        leave_if_forked(parent, 0)
        if before is not None:
            before.restore(who)
        return result

    return run


async def kept_await(awaitable, who: Callable[[], str]) -> Any:
    """An awaitable under the same contract, checked when it finishes (on the event loop's thread)."""
    parent = os.getpid()
    before = ProcessState()
    try:
        result = await awaitable
    except BaseException as err:
        leave_if_forked(parent, child_exit_code(err))
        _restore_quietly(before, who)
        raise
    leave_if_forked(parent, 0)
    before.restore(who)
    return result
