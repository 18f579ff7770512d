"""Rewards for the reliability tests: a dense score, plus a hook a test sets to act (send a signal, exit) from
inside a reward at a chosen step, the way a user's reward code would."""

from __future__ import annotations

from typing import Callable

ACTIONS: dict[int, Callable[[], None]] = {}  # trainer_state.global_step -> what the reward does first at that step


def _act(trainer_state) -> None:
    action = ACTIONS.pop(trainer_state.global_step, None)
    if action is not None:
        action()


def lowercase(completions, trainer_state, **_):
    """Share of lowercase letters: dense enough that a random tiny model gets a learning signal."""
    _act(trainer_state)
    return [sum("a" <= c <= "z" for c in text) / max(len(text), 1) for text in completions]


async def lowercase_async(completions, trainer_state, **_):
    """`lowercase` as an async reward (TRL 1.16 runs those on an event loop)."""
    return lowercase(completions, trainer_state)
