"""Calling reward functions as TRL 1.16 does: sync ones in order, async ones (`async def`, or a callable object with
an `async def __call__`) awaited together on one event loop that lives for the process, on its own daemon thread
(so a reward's client sessions stay bound to one loop, and a caller already inside an event loop, a notebook,
still works). A reward that calls sys.exit() or raises KeyboardInterrupt gets a UserCodeExit, never an exit.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable

from vlm_grpo.grpo import async_loop
from vlm_grpo.grpo.interrupts import UserCodeExit, call_user, exit_reason

async def _settled(awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    """(True, value) or (False, the exception): a SystemExit inside a coroutine must not stop the loop's thread."""
    try:
        return True, await awaitable
    except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
        return False, err


def await_all(awaitables: list[Awaitable[Any]]) -> list[tuple[bool, Any]]:
    """Every awaitable run concurrently on the rewards' event loop; (ok, value or exception) for each, in order."""

    async def gather():
        return await asyncio.gather(*(_settled(a) for a in awaitables))

    return async_loop.run(gather())


def _raise_failure(err: BaseException) -> None:
    if isinstance(err, (SystemExit, KeyboardInterrupt)):
        raise UserCodeExit(exit_reason(err)) from None
    raise err


def call_reward(call: Callable[[], Any]) -> Any:
    """`call()`'s result, awaited when it is awaitable; user exits become UserCodeExit."""
    result = call_user(call)
    if inspect.isawaitable(result):
        ok, result = await_all([result])[0]
        if not ok:
            _raise_failure(result)
    return result


def call_rewards(calls: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """Each call's (ok, result or exception): sync rewards run in order, then the async ones all at once."""
    settled: list[tuple[bool, Any] | None] = []
    pending: dict[int, Awaitable[Any]] = {}
    for k, call in enumerate(calls):
        try:
            result = call_user(call)
        except Exception as err:  # noqa: BLE001 - user code may raise anything; reported by the caller
            settled.append((False, err))
            continue
        if inspect.isawaitable(result):
            pending[k] = result
            settled.append(None)
        else:
            settled.append((True, result))
    for k, (ok, value) in zip(pending, await_all(list(pending.values())) if pending else []):
        if not ok and isinstance(value, (SystemExit, KeyboardInterrupt)):
            value = UserCodeExit(exit_reason(value))
        settled[k] = (ok, value)
    return settled  # type: ignore[return-value]
