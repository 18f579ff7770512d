"""Stopping a run cleanly: SIGINT/SIGTERM ask the loop to save a checkpoint after the current step and return;
a second signal stops at once."""

from __future__ import annotations

import contextlib
import signal
import threading


class StopRequest:
    signum: int | None = None


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM ask the loop to save a checkpoint after the current step and return."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, _frame):
        if request.signum is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        request.signum = signum

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
