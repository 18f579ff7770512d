"""transformers' `TrainerCallback`s in a vlm-grpo run, called through transformers' own `CallbackHandler` with
its `DefaultFlowCallback` first, so the moments are transformers' (Trainer's) rules: after each step on_step_end
(and on_epoch_end at a pass's last step) decide whether the step is logged (on_log, state.log_history: the numbers
averaged over the steps since the last log, as the Trainer does), evaluated (on_evaluate) and whether training
stops; on_save follows every checkpoint written; on_train_begin / on_train_end frame the run.
`control.should_training_stop` stops the run after the step, saved.
Each user callback runs through the guarded call site of user code (grpo/user_calls.py), its construction included:
one that raises or exits is one error naming it, the event and the step, and the checkpoints of completed steps stay;
it gets copies of the logs and metrics, so an edit cannot reach the run's own."""

from __future__ import annotations

import copy
from typing import Any, Sequence

from vlm_grpo.api.schedule import Schedule
from vlm_grpo.grpo.user_calls import call


def _guarded_handler(callbacks: Sequence[Any]):
    """transformers' CallbackHandler, each user callback called (and built) through the guarded call site."""
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    class GuardedHandler(CallbackHandler):
        def add_callback(self, callback):
            if isinstance(callback, type) and callback is not DefaultFlowCallback:
                callback = call("callback", callback)
            super().add_callback(callback)

        def call_event(self, event, args, state, control, **kwargs):
            parts = dict(model=self.model, processing_class=self.processing_class, optimizer=self.optimizer,
                         lr_scheduler=self.lr_scheduler, train_dataloader=self.train_dataloader,
                         eval_dataloader=self.eval_dataloader)
            for callback in self.callbacks:
                method = getattr(callback, event, None)
                if method is None:  # a duck-typed callback without this event (not a TrainerCallback subclass)
                    continue
                if isinstance(callback, DefaultFlowCallback):  # transformers' own flow: not user code
                    result = method(args, state, control, **parts, **kwargs)
                else:
                    mine = copy.deepcopy(kwargs)
                    result = call(f"callback {event}", method, context={"step": state.global_step},
                                  via=lambda f: f(args, state, control, **parts, **mine))
                if result is not None:
                    control = result
            return control

    return GuardedHandler([DefaultFlowCallback, *(callbacks or ())], None, None, None, None)


class CallbackBridge:
    def __init__(self, callbacks: Sequence[Any], args: Any):
        from transformers import TrainerControl, TrainerState

        self.handler = _guarded_handler(callbacks)
        self.args = args
        self.state, self.control = TrainerState(), TrainerControl()
        self.schedule: Schedule | None = None
        self.pending: list[dict[str, Any]] = []  # the steps since the last logged one

    @property
    def callbacks(self) -> list[Any]:
        return self.handler.callbacks

    def _parts(self, run) -> None:
        self.handler.model, self.handler.processing_class = run.adapter.model, run.adapter.processor
        self.handler.optimizer, self.handler.lr_scheduler = run.optimizer, run.lr_scheduler

    # ---------------------------------------------------------------- the run's moments
    def begin(self, run, schedule: Schedule) -> None:
        self.schedule = schedule
        self._parts(run)
        state = self.state
        state.max_steps, state.num_train_epochs = run.cfg.max_steps, -(-run.cfg.max_steps // schedule.steps_per_epoch)
        state.logging_steps, state.eval_steps = schedule.log_every, schedule.eval_every
        state.save_steps = run.saves.save_every
        state.train_batch_size = run.cfg.data.batch_size * run.cfg.data.num_generations  # completions, as TRL counts
        state.is_world_process_zero = state.is_local_process_zero = run.is_main
        self.control = self.handler.on_train_begin(self.args, state, self.control)
        self.control = self.handler.on_epoch_begin(self.args, state, self.control)

    def step(self, run, metrics: dict[str, Any]) -> tuple[bool, bool]:
        """After a step: (evaluate now, stop the run)."""
        step = int(metrics["step"])
        state, schedule = self.state, self.schedule
        state.global_step, state.epoch = step, step / schedule.steps_per_epoch
        self.pending.append(metrics)
        self.control = self.handler.on_step_begin(self.args, state, self.control)
        self.control = self.handler.on_step_end(self.args, state, self.control)
        if schedule.epoch_end(step):
            self.control = self.handler.on_epoch_end(self.args, state, self.control)
            if step < state.max_steps:
                self.control = self.handler.on_epoch_begin(self.args, state, self.control)
        if self.control.should_log:
            self.log(self._averaged(), run)
        return bool(self.control.should_evaluate), bool(self.control.should_training_stop)

    def _averaged(self) -> dict[str, Any]:
        """The steps since the last log: numbers averaged (the Trainer logs means over the logging interval)."""
        steps, self.pending = self.pending, []
        out: dict[str, Any] = {}
        for key in steps[-1]:
            values = [m[key] for m in steps if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool)]
            out[key] = sum(values) / len(values) if len(values) == len(steps) and key != "step" else steps[-1][key]
        return out

    def log(self, logs: dict[str, Any], run=None) -> None:
        entry = {**logs, "epoch": self.state.epoch, "step": self.state.global_step}
        self.state.log_history.append(entry)
        self.control = self.handler.on_log(self.args, self.state, self.control, logs=dict(logs))

    def saved(self, run, step: int) -> None:
        self.state.global_step = step
        self.control = self.handler.on_save(self.args, self.state, self.control)

    def evaluated(self, run, metrics: dict[str, Any]) -> None:
        self._parts(run)
        self.log(metrics, run)
        self.control = self.handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)

    def end(self, run, summary: dict[str, Any]) -> None:
        self._parts(run)
        # the steps since the last log join it, as TRL's log() merges its step metrics; the Trainer's own numbers
        # (loss, grad_norm, learning_rate) are logged only at logging steps
        pending = self._averaged() if self.pending else {}
        for key in ("step", "loss", "grad_norm", "learning_rate"):
            pending.pop(key, None)
        self.log({**pending, **summary}, run)  # the Trainer's last log: runtime and mean loss
        self.control = self.handler.on_train_end(self.args, self.state, self.control)
