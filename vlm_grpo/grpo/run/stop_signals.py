"""Stopping a run cleanly on SIGINT/SIGTERM, so a scheduler can tell a stopped run from a finished one.

- Around the step loop (`stop_on_signals`): the first signal lets the current step finish; the loop then saves a
  checkpoint and raises `StopSignal` (exit code 130 for SIGINT, 143 for SIGTERM). A second signal while a
  checkpoint is being written waits for it (a half-written checkpoint would be lost work); a second signal at any
  other time stops at once, and the newest checkpoint on disk is the last one saved.
- Around a whole command (`signals_stop`, and `install` as the CLI's very first act, before any heavy import):
  SIGTERM stops like Ctrl-C does, with a `StopSignal`, never a traceback.
- Every signal is also recorded (`received()`): a StopSignal that some code swallows (raised inside a `__del__`, a
  garbage-collector callback or a library's `except BaseException`) still ends the command with 130/143
  (`raise_if_received` at the command's checkpoints, the exit code at its end).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from vlm_grpo.grpo.interrupts import StopSignal

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # every SIGINT/SIGTERM this process got, in order


def received() -> int | None:
    """The first signal this process received (None: none)."""
    return _received[0] if _received else None


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def raise_if_received() -> None:
    """A StopSignal when a signal came earlier and its StopSignal was swallowed on the way."""
    if _received:
        signum = _received[0]
        raise StopSignal(signum, f"stopped by {signal.Signals(signum).name}", at_once=True)


IMPORT_FRAMES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def _importer(frame):
    """The frame whose `import` statement is running when `frame` is inside import machinery (None otherwise)."""
    outer = None
    while frame is not None:
        if frame.f_code.co_filename in IMPORT_FRAMES:
            outer = frame
        frame = frame.f_back
    return outer.f_back if outer is not None else None


def _stop_now(signum, frame):
    """Raise StopSignal where the program is, except inside an import: an exception raised in a module's top level
    can leave a C extension half made (torch then aborts the process), so there it is raised on the next line of
    the code whose import was running, once that import is complete."""
    _received.append(signum)
    stop = StopSignal(signum, f"stopped by {signal.Signals(signum).name}", at_once=True)
    importer = _importer(frame)
    if importer is None:
        raise stop

    def on_line(frame, event, _arg):
        if event == "line":
            sys.settrace(None)
            frame.f_trace = None
            raise stop
        return on_line

    importer.f_trace = on_line
    sys.settrace(lambda *_: None)  # frame tracing on (no new frame is traced: only the importer's next line)


def install() -> None:
    """SIGINT and SIGTERM raise StopSignal from now on (the main thread only may set handlers); a new command starts
    with no signal received."""
    _received.clear()
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _stop_now)


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class StopRequest:
    """What the loop reads after each step: the signal received (None: none), and whether a save is under way."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.saving = False

    @contextlib.contextmanager
    def saving_checkpoint(self):
        """A save that a second signal waits for."""
        self.saving = True
        try:
            yield
        finally:
            self.saving = False


@contextlib.contextmanager
def _handlers(handler):
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def stop_on_signals():
    """The step loop's handlers; yields the StopRequest the loop checks after each step."""
    request = StopRequest()

    def handler(signum, _frame):
        _received.append(signum)
        name = signal.Signals(signum).name
        if request.signum is None:
            request.signum = signum
            _note(f"\n{name}: stopping after the current step, which is saved as a checkpoint (again: stop at once)")
        elif request.saving:
            _note(f"{name}: a checkpoint is being written; stopping as soon as it is complete")
        else:
            raise StopSignal(signum, f"stopped at once by a second {name}", at_once=True)

    with _handlers(handler):
        yield request


@contextlib.contextmanager
def signals_stop():
    """Around a command: SIGINT and SIGTERM raise StopSignal wherever the program is (outside the step loop)."""
    raise_if_received()
    with _handlers(_stop_now):
        yield
