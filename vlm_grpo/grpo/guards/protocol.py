"""What a guard is, and the one thing that runs guards.

A guard watches a step and says what it found: `observe(step, metrics, rows)` reads the step's numbers (`metrics`,
averaged over processes) and which of this process's completions show what (`rows`, by name; empty when the caller
has none), and returns a list of `Trip`s, empty when nothing is wrong. A guard that must stop the run raises
`TrainingHalted` instead. Its own warnings it logs itself, once per cause.

`Guards` runs a stage's guards in order and keeps them by name (their state travels in checkpoints by that name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol


class TrainingHalted(RuntimeError):
    """A guard stopped the run; the newest checkpoint on disk is the last good state."""


@dataclass
class Trip:
    """What a guard found at a step."""

    guard: str  # the guard's name
    message: str  # one line naming the step and what was seen
    rows: list[int] = field(default_factory=list)  # the step's completions that show it (examples, flagged)
    key: str = ""  # what is warned of once per run (default: the guard)


class Guard(Protocol):
    name: str

    def observe(self, step: int, metrics: dict[str, Any], rows: dict[str, list[int]]) -> list[Trip]:
        """What the step shows ([] when nothing); raises TrainingHalted when the run must stop at once."""
        ...


class Guards:
    """A stage's guards, by name, each observing every step in the order given."""

    def __init__(self, guards: Iterable[Guard]):
        self.by_name: dict[str, Guard] = {g.name: g for g in guards}

    def observe(self, step: int, metrics: dict[str, Any], rows: dict[str, list[int]] | None = None) -> list[Trip]:
        rows = rows if rows is not None else {}
        return [trip for guard in self.by_name.values() for trip in guard.observe(step, metrics, rows)]
