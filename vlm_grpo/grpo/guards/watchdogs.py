"""Watchdogs over the training metrics: non-finite updates and KL blow-ups stop a run before it trains on garbage;
steps that carry no learning signal (groups scoring alike, rewards that apply to nothing) warn with their cause."""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

from vlm_grpo.grpo.guards.protocol import Guards, TrainingHalted, Trip
from vlm_grpo.grpo.settings.sections import GuardConfig, TrainConfig


log = logging.getLogger(__name__)


def watchdogs(cfg: TrainConfig) -> Guards:
    """The guards every stage's loop runs over each step's metrics, fresh for each train()."""
    return Guards([NonFiniteGuard(cfg.guard.max_nonfinite_steps), KLWatchdog(cfg.guard),
                   LearningSignalMonitor(cfg.generation.temperature)])


class NonFiniteGuard:
    name = "non_finite"

    def __init__(self, limit: int):
        self.limit = limit
        self.consecutive = 0

    def observe(self, step: int, metrics: dict[str, Any], rows: dict[str, list[int]]) -> list[Trip]:
        bad = metrics.get("skipped_updates", 0) > 0 or not math.isfinite(float(metrics.get("loss", 0.0)))
        self.consecutive = self.consecutive + 1 if bad else 0
        if self.limit > 0 and self.consecutive >= self.limit:
            raise TrainingHalted(
                f"{self.consecutive} consecutive steps had a non-finite loss or gradient, or an update that made "
                f"weights non-finite (updates skipped or undone, weights as before) up to step {step}; "
                "the newest checkpoint is the last good one; check the learning rate, rewards and data"
            )
        return []


class KLWatchdog:
    """Warns (or stops) when the mean KL jumps by orders of magnitude, the cryptogram blog's sign of a run gone awry."""

    name = "kl_spike"

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.history: list[float] = []

    def observe(self, step: int, metrics: dict[str, Any], rows: dict[str, list[int]]) -> list[Trip]:
        kl = metrics.get("kl")
        if kl is None or not math.isfinite(float(kl)):
            return []
        trips = []
        if len(self.history) >= self.cfg.kl_spike_warmup:
            baseline = statistics.median(self.history[-10:])
            if kl >= self.cfg.kl_spike_min and kl > self.cfg.kl_spike_factor * max(baseline, 1e-12):
                message = f"step {step}: mean KL {kl:.3g} is {kl / max(baseline, 1e-12):.3g}x its recent median {baseline:.3g}"
                log.warning("KL spike: %s", message)
                if self.cfg.kl_spike_action == "stop":
                    raise TrainingHalted(f"KL spike: {message}; stopped, the newest checkpoint is the last good one")
                trips.append(Trip(self.name, message))
        self.history.append(float(kl))
        return trips


class LearningSignalMonitor:
    """Warns, once each, when steps carry no learning signal, with the likely cause: every group's completions
    scored alike for `patience` steps in a row (frac_reward_zero_std = 1), a reward that applied to no completion
    of a step (it returned None for all), or no reward applying to anything. One call per step."""

    name = "learning_signal"

    def __init__(self, temperature: float, patience: int = 3, low_temperature: float = 0.3):
        self.temperature, self.patience, self.low_temperature = temperature, patience, low_temperature
        self.streak = 0
        self.warned: set[str] = set()

    def _warn(self, key: str, message: str) -> Trip | None:
        if key in self.warned:
            return None
        self.warned.add(key)
        log.warning(message)
        return Trip(self.name, message, key=key)

    def cause(self, metrics: dict[str, Any]) -> str:
        if self.temperature < self.low_temperature:
            return (f"generation.temperature {self.temperature:g} is so low that the completions of a prompt come out "
                    "(nearly) the same: sample hotter (0.7-1.0)")
        if float(metrics.get("reward_std", 1.0)) == 0.0:
            return (f"every completion of the step scored {float(metrics.get('reward', math.nan)):.4g}: the rewards "
                    "never tell completions apart (a reward that never fires, or a task far too hard or too easy)")
        return ("the completions of each prompt score alike: pass/fail rewards on prompts the model always or never "
                "solves give no signal (graded rewards, or harder/easier prompts)")

    def observe(self, step: int, metrics: dict[str, Any], rows: dict[str, list[int]]) -> list[Trip]:
        said = []
        for key, value in metrics.items():
            if key.startswith("rewards/") and isinstance(value, float) and math.isnan(value):
                said.append(self._warn(key, f"step {step}: reward {key.split('/', 1)[1]!r} returned None for every "
                                            "completion (it applies to none of them); check the columns it reads"))
        if isinstance(metrics.get("reward"), float) and math.isnan(metrics["reward"]):
            said.append(self._warn("reward", f"step {step}: no reward applies to any completion: every advantage is 0 "
                                             "and the step trains nothing"))
        frac = metrics.get("frac_reward_zero_std")
        self.streak = self.streak + 1 if frac is not None and float(frac) >= 1.0 else 0
        if self.streak >= self.patience:
            said.append(self._warn("zero_spread", f"steps {step - self.streak + 1}-{step}: in every group the "
                                   "completions had the same reward (frac_reward_zero_std = 1), so these steps trained "
                                   f"nothing: {self.cause(metrics)}"))
        return [m for m in said if m]

