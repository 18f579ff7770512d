"""One background event loop for users' async code (async rewards, async tools), as TRL 1.16 runs them: started on
first use in a daemon thread, so coroutines are awaited together even when the caller is synchronous.

A coroutine that blocks the loop (a `time.sleep` or a busy loop inside `async def`) cannot be cancelled by the loop
itself: past the caller's time limit the caller stops waiting, that loop is abandoned (its thread is asked to stop)
and the next call starts a fresh one, so one blocking coroutine never hangs the trainer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine

_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_guard = threading.Lock()
RESPONSIVE_S = 0.2  # a loop that does not run a no-op within this long after a timeout is blocked


class LoopTimeout(TimeoutError):
    """The coroutine gave no result within the time limit."""


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_forever()
    except BaseException:  # noqa: BLE001 - an abandoned loop's thread, stopped: nothing waits on it any more
        pass


def _current() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    global _loop, _thread
    with _guard:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_serve, args=(_loop,), name="vlm-grpo-async-user-code", daemon=True)
            _thread.start()
        return _loop, _thread


def _abandon(loop: asyncio.AbstractEventLoop, thread: threading.Thread, stop: Callable[[threading.Thread], None] | None,
             ) -> None:
    """Forget a blocked loop (the next call starts another) and stop its thread's code where Python can."""
    global _loop, _thread
    with _guard:
        if _loop is loop:
            _loop, _thread = None, None
    loop.call_soon_threadsafe(loop.stop)
    if stop is not None:
        stop(thread)


def _responsive(loop: asyncio.AbstractEventLoop) -> bool:
    ran = threading.Event()
    loop.call_soon_threadsafe(ran.set)
    return ran.wait(RESPONSIVE_S)


def run(coroutine: Coroutine[Any, Any, Any], timeout: float | None = None,
        stop: Callable[[threading.Thread], None] | None = None) -> Any:
    """The coroutine's result, run on the shared background loop; past `timeout` seconds a LoopTimeout (the
    coroutine cancelled, or its loop abandoned when it blocks the loop; `stop(thread)` then stops that thread)."""
    loop, thread = _current()
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        if not _responsive(loop):
            _abandon(loop, thread, stop)
        raise LoopTimeout(f"no result within {timeout:g} s") from None
