"""transformers' `TrainerCallback`s in a vlm-grpo run: called with the `args`, a `TrainerState` and a
`TrainerControl` as `transformers.Trainer` calls them, at the moments this loop has (train begin and end, each
step's end and its logs, an evaluation); `control.should_training_stop` stops the run after the step, saved.
Each event runs through the guarded call site of user code (grpo/user_calls.py): a callback that raises or exits
is one error naming it, the event and the step, and the checkpoints of completed steps stay."""

from __future__ import annotations

import copy
from typing import Any, Sequence

from vlm_grpo.grpo.user_calls import call


class CallbackBridge:
    def __init__(self, callbacks: Sequence[Any], args: Any):
        from transformers import TrainerControl, TrainerState

        self.callbacks = [call("callback", cb) if isinstance(cb, type) else cb for cb in callbacks or ()]
        self.args = args
        self.state, self.control = TrainerState(), TrainerControl()

    def _event(self, name: str, trainer, **kwargs: Any) -> None:
        parts = {"model": trainer.adapter.model, "processing_class": trainer.adapter.processor,
                 "optimizer": getattr(trainer, "optimizer", None), "lr_scheduler": getattr(trainer, "scheduler", None)}
        kwargs = copy.deepcopy(kwargs)  # logs and metrics: a callback's edit must not reach the run's own
        for callback in self.callbacks:
            result = call(f"callback {name}", getattr(callback, name), context={"step": self.state.global_step},
                          via=lambda f: f(self.args, self.state, self.control, **parts, **kwargs))
            if result is not None:
                self.control = result

    def begin(self, trainer) -> None:
        self.state.max_steps = trainer.cfg.max_steps
        self.state.is_world_process_zero = self.state.is_local_process_zero = trainer.is_main
        self.control.should_training_stop = False
        self._event("on_train_begin", trainer)

    def step(self, trainer, metrics: dict[str, Any]) -> bool:
        """A step hook of the run: true when a callback asked the run to stop."""
        self.state.global_step = int(metrics["step"])
        self.state.log_history.append(dict(metrics))
        self._event("on_step_end", trainer)
        self._event("on_log", trainer, logs=dict(metrics))
        return bool(self.control.should_training_stop)

    def end(self, trainer) -> None:
        self._event("on_train_end", trainer)

    def evaluated(self, trainer, metrics: dict[str, Any]) -> None:
        self._event("on_evaluate", trainer, metrics=metrics)
