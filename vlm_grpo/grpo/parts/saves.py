"""When the step loop saves and how it stops: periodic checkpoints, a signal's or a guard's stop (the step saved
first), the last completed step kept when user code fails after it, the end's checkpoint and final model, and a
failure's traceback in the run directory with the lock released."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable

from vlm_grpo.grpo.interrupts import StopSignal
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo.run.logs import log_failure
from vlm_grpo.grpo.guards.protocol import TrainingHalted


class Saves:
    def __init__(self, ctx, checkpoints, save_every: int):
        """`save_every`: steps between periodic checkpoints (0: none), as the run resolved it."""
        self.ctx, self.cfg, self.checkpoints = ctx, ctx.cfg, checkpoints
        self.save_every = save_every

    def after_step(self, done: int, stop, halt: str | None, close: Callable[[], Any]) -> None:
        """After step `done` (1-based): a guard's stop (`halt`) or a signal saves it and stops the run; so does
        save_every."""
        cfg = self.cfg
        signum = self.ctx.agreed_stop(stop.signum)
        if halt:  # guard.on_hacking stop: this step saved, then stop
            with stop.saving_checkpoint():
                self.checkpoints.save(done)
            raise TrainingHalted(f"{halt}; checkpoint-{done} saved, stopped (guard.on_hacking stop)")
        periodic = self.save_every and done % self.save_every == 0 and done < cfg.max_steps
        if periodic:
            with stop.saving_checkpoint():
                self.checkpoints.save(done)
            signum = self.ctx.agreed_stop(stop.signum)  # a signal during the save stops here, not a step later
        if signum and done < cfg.max_steps:
            if not periodic:
                with stop.saving_checkpoint():
                    self.checkpoints.save(done)
            close()
            self.stopped(signum, done)

    def before_step(self, done: int, stop, close: Callable[[], Any]) -> None:
        """Before the next step, `done` steps completed and saved by `after_step` unless a signal came since (during
        the step hooks or callbacks): then that step is saved and the run stops before another one trains."""
        signum = self.ctx.agreed_stop(stop.signum)
        if not signum:
            return
        if not (self.save_every and done % self.save_every == 0):  # after_step saved it already
            with stop.saving_checkpoint():
                self.checkpoints.save(done)
        close()
        self.stopped(signum, done)

    def keep_completed(self, done: int, stop) -> None:
        """User code failed after step `done`: the step is kept (one process; when no checkpoint holds it yet)."""
        if self.ctx.accelerator.num_processes > 1 or (self.ctx.run_dir / f"checkpoint-{done}").is_dir():
            return
        with stop.saving_checkpoint():
            self.checkpoints.save(done)
        print(f"checkpoint-{done} saved (the last completed step, before the failure); {self.ctx.resume_hint} continues "
              "from it "
              "once the cause is fixed", file=sys.stderr)

    def at_end(self, last: int | None, stop) -> None:
        """The last step run (None: none ran) saved as a checkpoint (logging.checkpoint_at_end), and final/
        (logging.final_at_end, or to push it)."""
        cfg = self.cfg
        with stop.saving_checkpoint():
            if cfg.logging.checkpoint_at_end and (last is not None or not ckpt.latest_checkpoint(self.ctx.run_dir)):
                self.checkpoints.save(cfg.max_steps if last is None else last)
            final = cfg.logging.final_at_end or cfg.logging.push_to_hub
            if final:
                self.checkpoints.save_final()
        signum = self.ctx.agreed_stop(stop.signum)
        if signum:
            self.stopped(signum, cfg.max_steps if last is None else last, "final/ is saved too; " if final else "")

    def stopped(self, signum: int, step: int, also: str = "") -> None:
        name = StopSignal(signum, "").name
        raise StopSignal(signum, f"stopped at step {step} by {name}; checkpoint-{step} saved in {self.ctx.run_dir}; "
                         f"{also}{self.ctx.resume_hint} continues")

    @contextlib.contextmanager
    def failures_logged(self, step: Callable[[], int]):
        """A failure's full traceback in the run directory (its message says one line) and the lock released; a
        second signal's stop names the newest checkpoint (`step()`: the 0-based step running)."""
        try:
            yield
        except StopSignal as err:
            self.ctx.release_lock()
            if err.at_once:
                newest = ckpt.latest_checkpoint(self.ctx.run_dir)
                raise StopSignal(err.signum, f"{err.message} during step {step() + 1}; not saved: the newest "
                                 f"checkpoint is {newest.name if newest else 'none'}; {self.ctx.resume_hint} continues "
                                 "from it") from None
            raise
        except BaseException as err:
            self.ctx.release_lock()
            if self.ctx.is_main:
                log_failure(self.ctx.run_dir, err)
            raise
