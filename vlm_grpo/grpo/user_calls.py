"""The one place user code runs: rewards, tools, environment reset and methods, judges, callbacks, dataset builders.

`call(kind, fn, ...)` runs `fn` and turns everything it may do wrong into a `UserCodeError` naming it:
- any BaseException it raises, `sys.exit()` and a KeyboardInterrupt of its own included (a real SIGINT/SIGTERM is
  our `StopSignal` and passes through); `exited` marks the ones that tried to end the program, always fatal;
- a time limit (`timeout`), for sync, CPU-bound and async code alike:
  - `isolation="thread"`: the call runs in a thread; one that overruns is stopped by an exception raised inside it
    (this stops Python code that spins; a call blocked inside C, a sleep or a socket, waits there using no CPU and
    is abandoned). An async function whose coroutine blocks the event loop loses that loop: the next call gets a
    fresh one, so the trainer never waits on it.
  - `isolation="process"`: the call runs in a forked worker process, killed when it overruns, so nothing it does
    outlives the limit. Its effects on the trainer's memory are lost (state must live in its return value).
The error's one line says the function, its file:line, what it ran on (sample, row, step) and the exception; the
full traceback is kept on the error (`traceback_text`) for the run's errors.log and `--debug`.
Every call also runs under grpo/call_contract.py: a fork inside it never runs trainer code, and process-wide state
it changes (working directory, streams, torch's grad mode, dtype and threads, signal handlers) is restored with a
warning, or named in the call's error where it cannot be.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from vlm_grpo.grpo import async_loop, call_contract
from vlm_grpo.grpo.interrupts import StopSignal, exit_reason

ISOLATION = ("thread", "process")
PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # frames inside vlm_grpo are not the user's
ERROR_LOG = "errors.log"
RETURNS = {"reward": " its scores", "tool": " its result", "environment reset": " its observation"}  # the run's traceback log (one block per failure)


class CallTimeout(TimeoutError):
    """A user call ran past its time limit."""


class _Stopped(BaseException):
    """Raised inside a thread that overran its time limit, to stop it (user code catching Exception keeps going)."""


def function_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):  # a callable object
        return type(fn).__name__
    return name.rpartition("<locals>.")[2]  # where it was defined says nothing to the reader


def _code_file(fn: Any) -> str | None:
    target = inspect.unwrap(fn) if callable(fn) else fn
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None) or getattr(getattr(type(target), "__call__", None), "__code__", None)
    return code.co_filename if code is not None else None


def location(fn: Any, err: BaseException | None = None) -> str:
    """`file:line` where `fn` failed: the innermost frame in its own file, else the innermost outside vlm_grpo, else
    where it is defined."""
    own = _code_file(fn)
    frames = traceback.extract_tb(err.__traceback__) if err is not None and err.__traceback__ else []
    frames = [f for f in frames if not f.filename.startswith("<frozen")]
    for pick in ([f for f in frames if f.filename == own], [f for f in frames if not f.filename.startswith(PACKAGE_DIR)]):
        if pick:
            return f"{pick[-1].filename}:{pick[-1].lineno}"
    try:
        target = inspect.unwrap(fn)
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (TypeError, OSError):
        return own or "?"


def describe(err: BaseException) -> str:
    if isinstance(err, (SystemExit, KeyboardInterrupt)):
        return exit_reason(err)
    if isinstance(err, CallTimeout):
        return f"timed out ({err})"
    if isinstance(err, call_contract.StateBroken):
        return str(err)
    text = str(err).splitlines()[0] if str(err) else ""
    return f"raised {type(err).__name__}" + (f": {text}" if text else "")


class WorkerFailure(Exception):
    """What failed in a worker process, as text (its exception may not pickle)."""

    def __init__(self, what: str, where: str, traceback_text: str, exited: bool):
        super().__init__(what)
        self.what, self.where, self.traceback_text, self.exited = what, where, traceback_text, exited


class UserCodeError(RuntimeError):
    """User code failed: `kind` (reward, tool, environment reset ...) `function` at `where` `what` happened, on
    `sample` (e.g. "completion 3 (dataset row 7)") at `step`. `exited`: it tried to end the program (always fatal);
    `timed_out`: it overran its limit."""

    def __init__(self, kind: str, function: str, where: str, what: str, *, sample: str | None = None,
                 step: int | None = None, exited: bool = False, timed_out: bool = False, traceback_text: str = "",
                 hint: str = "", cause: BaseException | None = None, label: str | None = None):
        self.kind, self.function, self.where, self.what = kind, function, where, what
        self.label = label or function  # the name the run knows it by (a reward's name)
        self.sample, self.step, self.exited, self.timed_out = sample, step, exited, timed_out
        self.traceback_text, self.hint, self.cause = traceback_text, hint, cause
        super().__init__(self.line())

    @classmethod
    def of(cls, kind: str, fn: Any, err: BaseException, **context: Any) -> "UserCodeError":
        if isinstance(err, UserCodeError):  # already named (a nested call): add what this level knows
            return err.where_also(**context)
        if isinstance(err, WorkerFailure):
            return cls(kind, function_name(fn), err.where, err.what, exited=err.exited,
                       traceback_text=err.traceback_text, **context)
        return cls(kind, function_name(fn), location(fn, err), describe(err), cause=err,
                   exited=isinstance(err, (SystemExit, KeyboardInterrupt)), timed_out=isinstance(err, CallTimeout),
                   traceback_text="".join(traceback.format_exception(type(err), err, err.__traceback__)), **context)

    def where_also(self, sample: str | None = None, step: int | None = None, hint: str = "", label: str | None = None,
                   **_: Any) -> "UserCodeError":
        self.label = label or self.label
        self.sample = self.sample or sample
        self.step = self.step if self.step is not None else step
        self.hint = self.hint or hint
        self.args = (self.line(),)
        return self

    @property
    def broke_state(self) -> bool:
        """It left process-wide state that could not be put back (grpo/call_contract.py): never to be run again."""
        return isinstance(self.cause, call_contract.StateBroken)

    def line(self) -> str:
        on = [x for x in (self.sample, None if self.step is None else f"step {self.step}") if x]
        tail = f" must return{RETURNS.get(self.kind, '')}, not end the program" if self.exited else ""
        at = self.where if self.label == self.function else f"{self.function} at {self.where}"
        return (f"{self.kind} {self.label!r} ({at}) {self.what}" + (f" on {', '.join(on)}" if on else "")
                + (f": a {self.kind}{tail}" if tail else "") + self.hint)

    def __str__(self) -> str:
        return self.line()


# ---------------------------------------------------------------- running a call
def call(kind: str, fn: Callable, *args: Any, timeout: float | None = None, isolation: str = "thread",
         context: dict[str, Any] | None = None, via: Callable[[Callable], Any] | None = None, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` (or `via(fn)`, which calls it with what it reads), awaited when it returns an awaitable,
    within `timeout` seconds (None/0: no limit); whatever goes wrong is a UserCodeError naming `kind`, `fn` and
    `context` (sample=, step=, hint=, label=)."""
    context = context or {}
    who = _who(kind, fn, context)
    in_process = isolation == "process" and bool(timeout)
    # a worker process's state is its own: there only a fork inside the call is guarded
    thunk = call_contract.kept((lambda: via(fn)) if via is not None else (lambda: fn(*args, **kwargs)), who,
                               state=not in_process)
    try:
        if in_process:
            return _in_process(thunk, fn, timeout)
        if timeout and not inspect.iscoroutinefunction(fn):
            result = _in_thread(thunk, timeout)
        else:
            result = thunk()
        if inspect.isawaitable(result):
            result = async_loop.run(_settled(call_contract.kept_await(result, who)), timeout or None, stop=stop_thread)
            if not result[0]:
                raise result[1]
            result = result[1]
        return result
    except StopSignal:
        raise
    except async_loop.LoopTimeout as err:
        raise UserCodeError.of(kind, fn, CallTimeout(str(err)), **context) from None
    except BaseException as err:  # noqa: BLE001 - user code may raise anything, exits included: it is named here
        raise UserCodeError.of(kind, fn, err, **context) from None


def _who(kind: str, fn: Callable, context: dict[str, Any]) -> Callable[[], str]:
    """How a warning names the call (worked out only when one is given)."""
    def text() -> str:
        name, label = function_name(fn), context.get("label") or function_name(fn)
        return f"{kind} {label!r} ({location(fn) if label == name else f'{name} at {location(fn)}'})"

    return text


async def _settled(awaitable) -> tuple[bool, Any]:
    """(True, value) or (False, the exception): a SystemExit inside a coroutine must not stop the loop's thread."""
    try:
        return True, await awaitable
    except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
        return False, err


def settle_all(kind: str, calls: list[tuple[Callable, Callable[[], Any]]], contexts: list[dict] | None = None,
               timeout: float | None = None) -> list[tuple[bool, Any]]:
    """Each (fn, thunk)'s (True, result) or (False, UserCodeError): sync ones in order (each within `timeout`), then
    the awaitables they return awaited together on the shared loop (TRL 1.16's order for rewards), all within
    `timeout` (past it, every one still running counts as timed out)."""
    settled: list[tuple[bool, Any] | None] = []
    pending: dict[int, Any] = {}
    contexts = contexts or [{} for _ in calls]
    for k, (fn, thunk) in enumerate(calls):
        who = _who(kind, fn, contexts[k])
        thunk = call_contract.kept(thunk, who)
        try:
            result = _in_thread(thunk, timeout) if timeout and not inspect.iscoroutinefunction(fn) else thunk()
        except StopSignal:
            raise
        except BaseException as err:  # noqa: BLE001 - named below
            settled.append((False, UserCodeError.of(kind, fn, err, **contexts[k])))
            continue
        if inspect.isawaitable(result):
            pending[k] = call_contract.kept_await(result, who)
            settled.append(None)
        else:
            settled.append((True, result))
    if pending:
        async def gather():
            return await asyncio.gather(*(_settled(a) for a in pending.values()))

        try:
            outcomes = async_loop.run(gather(), timeout or None, stop=stop_thread)
        except async_loop.LoopTimeout as err:
            outcomes = [(False, CallTimeout(str(err)))] * len(pending)
        for k, (ok, value) in zip(pending, outcomes):
            settled[k] = (True, value) if ok else (False, UserCodeError.of(kind, calls[k][0], value, **contexts[k]))
    return settled  # type: ignore[return-value]


# ---------------------------------------------------------------- a thread that can be stopped
def stop_thread(thread: threading.Thread, tries: int = 20) -> None:
    """Raise _Stopped inside `thread` until it ends (a few tries: user code may swallow one); runs in the
    background, so the caller moves on at once."""
    def keep_stopping():
        for _ in range(tries):
            if not thread.is_alive() or thread.ident is None:
                return
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Stopped))
            thread.join(0.05)

    threading.Thread(target=keep_stopping, name="vlm-grpo-stop-user-call", daemon=True).start()


def _in_thread(thunk: Callable[[], Any], timeout: float) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = thunk()
        except _Stopped:
            pass
        except BaseException as err:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = err

    worker = threading.Thread(target=target, name="vlm-grpo-user-call", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        stop_thread(worker)
        raise CallTimeout(f"no result within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


# ---------------------------------------------------------------- a worker process that can be killed
def _child(thunk: Callable[[], Any], fn: Callable, conn) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the trainer handles signals; the worker just dies with it
        signal.signal(sig, signal.SIG_DFL)
    try:
        value = thunk()
        if inspect.isawaitable(value):
            async def wait():
                return await value
            value = asyncio.run(wait())
        payload = ("ok", pickle.dumps(value))
    except BaseException as err:  # noqa: BLE001 - sent to the parent as text
        payload = ("error", (describe(err), location(fn, err),
                             "".join(traceback.format_exception(type(err), err, err.__traceback__)),
                             isinstance(err, (SystemExit, KeyboardInterrupt))))
    try:
        conn.send(payload)
    except Exception as err:  # noqa: BLE001 - a result that does not pickle
        conn.send(("error", (f"returned a value that cannot leave its worker process ({type(err).__name__}: {err})",
                             location(fn), "", False)))
    conn.close()
    os._exit(0)  # no atexit handlers, no flushing the parent's buffers twice


def _in_process(thunk: Callable[[], Any], fn: Callable, timeout: float) -> Any:
    ctx = multiprocessing.get_context("fork")  # the function need not pickle: the child has it already
    receive, send = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=_child, args=(thunk, fn, send), name="vlm-grpo-user-call", daemon=True)
    worker.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise CallTimeout(f"no result within {timeout:g} s")
        try:
            status, payload = receive.recv()
        except EOFError:
            worker.join(1.0)
            raise RuntimeError(f"its worker process died (exit code {worker.exitcode})") from None
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join(5.0)
        receive.close()
    if status == "ok":
        return pickle.loads(payload)
    what, where, tb, exited = payload
    raise WorkerFailure(what, where, tb, exited)


# ---------------------------------------------------------------- the run's errors.log
def failure_entry(err: BaseException) -> str:
    """The errors.log entry for `err`: a time-stamped line and its full traceback (a UserCodeError's: the user
    code's own). The run directory writes it (grpo/safe_files.py), as every run file."""
    text = getattr(err, "traceback_text", "") or "".join(traceback.format_exception(type(err), err, err.__traceback__))
    from vlm_grpo.terminal import printable, safe_text

    # the text quotes user data (a completion, a row): no control sequence reaches whoever reads the log
    return f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {printable(err)}\n{safe_text(text)}\n"
