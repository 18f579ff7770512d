"""One background event loop for users' async code (async rewards, async tools), as TRL 1.16 runs them: started on
first use in a daemon thread, so coroutines are awaited together even when the caller is synchronous."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine

_loop: asyncio.AbstractEventLoop | None = None
_guard = threading.Lock()


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """The coroutine's result, run on the shared background loop."""
    global _loop
    with _guard:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="vlm-grpo-async-user-code", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coroutine, _loop).result()
