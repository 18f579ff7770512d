"""What may interrupt a run, told apart: a real SIGINT/SIGTERM (`StopSignal`) and user code that exits.

A reward that calls `sys.exit()` or raises `KeyboardInterrupt` must not look like a finished or a stopped run: it is
an error of that reward (grpo/user_calls.py says how it left, with `exit_reason`), and the run saves its last
completed step and exits non-zero. A real signal raises `StopSignal`, a `KeyboardInterrupt` that user code cannot be
confused with.

When a signal stops a run (grpo/run/stop_signals.py, grpo/parts/saves.py): the first SIGINT/SIGTERM lets the step in
progress finish (its rollout, scoring and update: a step is trained whole or not at all), that step is saved and the
run stops, never after a further step: a signal that lands while a step's checkpoint is written, or in the step
hooks and callbacks after it, stops the run before the next step starts. User code cannot take the stop away: the
trainer's handlers are put back after every user call (grpo/call_contract.py).
"""

from __future__ import annotations

import signal


class StopSignal(KeyboardInterrupt):
    """A SIGINT or SIGTERM stopped the run; `exit_code` is the shell's 128 + signal number (130, 143). `at_once`:
    raised where the program was (nothing saved), not after a step was saved."""

    def __init__(self, signum: int, message: str, at_once: bool = False):
        super().__init__(message)
        self.signum = signum
        self.message = message
        self.at_once = at_once

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def __str__(self) -> str:
        return self.message


def exit_reason(err: BaseException) -> str:
    """How user code tried to leave: `called sys.exit(0)` / `raised KeyboardInterrupt`."""
    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r})"
    return f"raised {type(err).__name__}"
