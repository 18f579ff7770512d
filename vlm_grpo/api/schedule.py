"""What transformers' `DefaultFlowCallback` needs to decide a TRL script's moments (which steps are logged and
evaluated, api/callbacks.py): the logging and evaluation intervals as the Trainer resolves them (a float below 1 is
a share of max_steps; eval_steps unset means logging_steps), where the passes over the data end, and whether to
evaluate before the first step. metrics.jsonl keeps every step whatever the schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def _steps(value: float, max_steps: int) -> int:
    """A steps setting as transformers reads it: a float below 1 is a share of max_steps (rounded up)."""
    return math.ceil(max_steps * value) if 0 < value < 1 else int(value)


@dataclass
class Schedule:
    max_steps: int
    steps_per_epoch: int
    logging_steps: float = 1  # GRPOConfig without TRL's logging fields: every step, as metrics.jsonl
    eval_steps: float | None = None
    eval_on_start: bool = False

    @classmethod
    def of(cls, given: dict[str, Any], max_steps: int, steps_per_epoch: int) -> "Schedule":
        known = {k: v for k, v in given.items() if k in cls.__dataclass_fields__ and v is not None}
        known = {k: getattr(v, "value", v) for k, v in known.items()}  # transformers' enums as their names
        return cls(max_steps=max_steps, steps_per_epoch=max(steps_per_epoch, 1), **known)

    def __post_init__(self) -> None:
        self.log_every = _steps(self.logging_steps, self.max_steps)
        # transformers: eval_steps unset (or 0) with the steps strategy means logging_steps
        self.eval_every = _steps(self.eval_steps, self.max_steps) if self.eval_steps else self.log_every

    def epoch_end(self, step: int) -> bool:
        """The last step of a pass (the run's last step ends its last, possibly partial, pass)."""
        return step % self.steps_per_epoch == 0 or step >= self.max_steps
