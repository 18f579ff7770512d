"""A corpus of faulty user code: rewards, tools, environments and callbacks that exit, raise, hang, spin, block the
event loop or mutate what they read. tests/reliability/test_user_code_faults.py runs every case through the public
entry points (score, run_calls, Toolset, CallbackBridge) and checks the documented outcome.

Each case: (id, class, kind, the function or class). Classes: exit, raise, hang, spin, async_block, mutate.
Below CASES: rewards that fork, change process-wide state or return numbers no float holds
(tests/reliability/test_user_code_contract.py).
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
import threading
import time

NEVER = threading.Event()  # never set: waiting on it is a hang


# ---------------------------------------------------------------- rewards
def reward_exit_0(completions, **_):
    sys.exit(0)


def reward_exit_1(completions, **_):
    sys.exit(1)


def reward_exit_text(completions, **_):
    sys.exit("giving up")


def reward_keyboard_interrupt(completions, **_):
    raise KeyboardInterrupt


async def reward_async_exit(completions, **_):
    sys.exit(0)


def reward_key_error(completions, **_):
    return [{}["missing"] for _ in completions]


def reward_generator_exit(completions, **_):
    raise GeneratorExit


def reward_base_exception(completions, **_):
    class Custom(BaseException):
        pass
    raise Custom("not an Exception")


def reward_hang(completions, **_):
    NEVER.wait()


def reward_sleep(completions, **_):
    time.sleep(600)


def reward_spin(completions, **_):
    while True:
        pass


def reward_spin_swallowing(completions, **_):
    while True:
        try:
            while True:
                pass
        except Exception:  # noqa: BLE001 - a careless user loop
            continue


async def reward_async_block(completions, **_):
    time.sleep(600)  # blocks the event loop


async def reward_async_hang(completions, **_):
    await asyncio.Event().wait()


def reward_mutates_completions(completions, **_):
    for k in range(len(completions)):
        completions[k] = "HACKED"
    completions.append("extra")
    return [0.0] * (len(completions) - 1)


def reward_mutates_fields(completions, answer, **_):
    answer[:] = ["HACKED"] * len(answer)
    return [0.0] * len(completions)


def reward_mutates_prompts(completions, prompts, **_):
    for p in prompts:
        if isinstance(p, list) and p:
            p[0]["content"] = "HACKED"
            p.clear()
    return [0.0] * len(completions)


def reward_mutates_messages(completions, **_):
    for c in completions:
        if isinstance(c, list):
            c[0]["content"] = "HACKED"
    return [0.0] * len(completions)


def reward_mutates_ids(completions, completion_ids, **_):
    for ids in completion_ids:
        ids[:] = [0]
    return [0.0] * len(completions)


# ---------------------------------------------------------------- tools (the model calls them with x=1)
def tool_exit_0(x: int) -> str:
    """Exit.

    Args:
        x: ignored
    """
    sys.exit(0)


def tool_keyboard_interrupt(x: int) -> str:
    """Interrupt.

    Args:
        x: ignored
    """
    raise KeyboardInterrupt


async def tool_async_exit(x: int) -> str:
    """Exit, async.

    Args:
        x: ignored
    """
    sys.exit(3)


def tool_sleep(x: int) -> str:
    """Sleep.

    Args:
        x: ignored
    """
    time.sleep(600)
    return "late"


def tool_hang(x: int) -> str:
    """Wait forever.

    Args:
        x: ignored
    """
    NEVER.wait()
    return "late"


def tool_spin(x: int) -> str:
    """Spin.

    Args:
        x: ignored
    """
    n = 0
    while True:
        n += 1


def tool_spin_swallowing(x: int) -> str:
    """Spin and swallow every exception it can.

    Args:
        x: ignored
    """
    while True:
        try:
            while True:
                pass
        except Exception:  # noqa: BLE001
            continue


async def tool_async_block(x: int) -> str:
    """Block the event loop.

    Args:
        x: ignored
    """
    time.sleep(600)
    return "late"


async def tool_async_spin(x: int) -> str:
    """Spin inside the event loop.

    Args:
        x: ignored
    """
    while True:
        pass


async def tool_async_hang(x: int) -> str:
    """Await forever.

    Args:
        x: ignored
    """
    await asyncio.Event().wait()
    return "late"


# ---------------------------------------------------------------- environments
class EnvResetExit:
    def reset(self, **_):
        sys.exit(0)

    def act(self, x: int) -> str:
        """Act.

        Args:
            x: ignored
        """
        return "ok"


class EnvResetInterrupt(EnvResetExit):
    def reset(self, **_):
        raise KeyboardInterrupt


class EnvResetRaises(EnvResetExit):
    def reset(self, **_):
        raise RuntimeError("no board")


class EnvInitExit(EnvResetExit):
    def __init__(self):
        sys.exit(2)


class EnvResetMutates(EnvResetExit):
    def reset(self, answer=None, images=None, **_):
        if isinstance(answer, list):
            answer.append("HACKED")
        if isinstance(images, list):
            images.clear()
        return None


# ---------------------------------------------------------------- callbacks (transformers' TrainerCallback events)
class _Callback:
    def on_train_begin(self, *a, **k):
        return None

    def on_step_end(self, *a, **k):
        return None

    def on_log(self, *a, **k):
        return None

    def on_train_end(self, *a, **k):
        return None

    def on_evaluate(self, *a, **k):
        return None


class CallbackExit(_Callback):
    def on_step_end(self, *a, **k):
        sys.exit(0)


class CallbackInterrupt(_Callback):
    def on_log(self, *a, **k):
        raise KeyboardInterrupt


class CallbackRaises(_Callback):
    def on_step_end(self, *a, **k):
        raise ValueError("bad callback")


class CallbackMutatesLogs(_Callback):
    def on_log(self, args, state, control, logs=None, **k):
        logs["reward"] = -1e9
        logs.clear()


def _cases():
    return [
        # exit: always a failure naming the function, never an exit of the trainer
        ("reward-exit-0", "exit", "reward", reward_exit_0),
        ("reward-exit-1", "exit", "reward", reward_exit_1),
        ("reward-exit-text", "exit", "reward", reward_exit_text),
        ("reward-keyboard-interrupt", "exit", "reward", reward_keyboard_interrupt),
        ("reward-async-exit", "exit", "reward", reward_async_exit),
        ("tool-exit-0", "exit", "tool", tool_exit_0),
        ("tool-keyboard-interrupt", "exit", "tool", tool_keyboard_interrupt),
        ("tool-async-exit", "exit", "tool", tool_async_exit),
        ("env-reset-exit", "exit", "environment", EnvResetExit),
        ("env-reset-interrupt", "exit", "environment", EnvResetInterrupt),
        ("env-init-exit", "exit", "environment", EnvInitExit),
        ("callback-exit", "exit", "callback", CallbackExit),
        ("callback-interrupt", "exit", "callback", CallbackInterrupt),
        # raise: a named failure (any BaseException)
        ("reward-key-error", "raise", "reward", reward_key_error),
        ("reward-generator-exit", "raise", "reward", reward_generator_exit),
        ("reward-base-exception", "raise", "reward", reward_base_exception),
        ("env-reset-raises", "raise", "environment", EnvResetRaises),
        ("callback-raises", "raise", "callback", CallbackRaises),
        # hang: ends within the time limit
        ("reward-hang", "hang", "reward", reward_hang),
        ("reward-sleep", "hang", "reward", reward_sleep),
        ("tool-sleep", "hang", "tool", tool_sleep),
        ("tool-hang", "hang", "tool", tool_hang),
        ("tool-async-hang", "hang", "tool", tool_async_hang),
        ("reward-async-hang", "hang", "reward", reward_async_hang),
        # spin: ends within the limit and uses no CPU afterwards
        ("reward-spin", "spin", "reward", reward_spin),
        ("reward-spin-swallowing", "spin", "reward", reward_spin_swallowing),
        ("tool-spin", "spin", "tool", tool_spin),
        ("tool-spin-swallowing", "spin", "tool", tool_spin_swallowing),
        # async block: a coroutine that blocks the loop does not hang the trainer
        ("tool-async-block", "async_block", "tool", tool_async_block),
        ("tool-async-spin", "async_block", "tool", tool_async_spin),
        ("reward-async-block", "async_block", "reward", reward_async_block),
        # mutate: edits reach neither the other rewards nor the logs
        ("reward-mutates-completions", "mutate", "reward", reward_mutates_completions),
        ("reward-mutates-fields", "mutate", "reward", reward_mutates_fields),
        ("reward-mutates-prompts", "mutate", "reward", reward_mutates_prompts),
        ("reward-mutates-messages", "mutate", "reward", reward_mutates_messages),
        ("reward-mutates-ids", "mutate", "reward", reward_mutates_ids),
        ("env-reset-mutates", "mutate", "environment", EnvResetMutates),
        ("callback-mutates-logs", "mutate", "callback", CallbackMutatesLogs),
    ]


CASES = _cases()


# ---------------------------------------------------------------- forks and process-wide state
FORKED: list[int] = []  # the children reward_forks made (the test waits for them)


def reward_forks(completions, **_):
    pid = os.fork()  # no exec: the child comes back out of this function into whatever called it
    if pid:
        FORKED.append(pid)
        return [0.5] * len(completions)
    return [9.0] * len(completions)


def reward_chdir(completions, **_):
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    return [0.0] * len(completions)


async def reward_async_chdir(completions, **_):
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    return [0.0] * len(completions)


def reward_replaces_stdout(completions, **_):
    sys.stdout = io.StringIO()  # to silence a library, never put back
    return [0.0] * len(completions)


def reward_closes_stdout(completions, **_):
    sys.stdout.close()
    return [0.0] * len(completions)


def reward_grad_off(completions, **_):
    import torch

    torch.set_grad_enabled(False)
    return [0.0] * len(completions)


def reward_float64(completions, **_):
    import torch

    torch.set_default_dtype(torch.float64)
    return [0.0] * len(completions)


def reward_threads(completions, **_):
    import torch

    torch.set_num_threads(torch.get_num_threads() + 1)
    return [0.0] * len(completions)


def reward_ignores_sigterm(completions, **_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return [0.0] * len(completions)


def reward_own_sigint_handler(completions, **_):
    signal.signal(signal.SIGINT, lambda *_: None)
    return [0.0] * len(completions)


def reward_huge_int(completions, **_):
    return [0.0] + [10**400] * (len(completions) - 1)


def reward_meta_device(completions, **_):
    import torch

    torch.set_default_device("meta")  # every later tensor would hold no data
    return [0.0] * len(completions)


def reward_closes_stdout_fd(completions, **_):
    os.close(sys.stdout.fileno())
    return [0.0] * len(completions)
