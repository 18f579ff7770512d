"""Watchdogs over the training metrics: non-finite updates and KL blow-ups stop a run before it trains on garbage."""

from __future__ import annotations

import logging
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

from vlm_grpo.grpo.settings.sections import GuardConfig


log = logging.getLogger(__name__)


class TrainingHalted(RuntimeError):
    """A guard stopped the run; the newest checkpoint on disk is the last good state."""


class NonFiniteGuard:
    def __init__(self, limit: int):
        self.limit = limit
        self.consecutive = 0

    def observe(self, metrics: dict[str, Any]) -> None:
        bad = metrics.get("skipped_updates", 0) > 0 or not math.isfinite(float(metrics.get("loss", 0.0)))
        self.consecutive = self.consecutive + 1 if bad else 0
        if self.limit > 0 and self.consecutive >= self.limit:
            raise TrainingHalted(
                f"{self.consecutive} consecutive steps had a non-finite loss or gradient (updates skipped, weights "
                f"untouched) up to step {metrics.get('step')}; check the learning rate, rewards and data"
            )


class KLWatchdog:
    """Warns (or stops) when the mean KL jumps by orders of magnitude, the cryptogram blog's sign of a run gone awry."""

    def __init__(self, cfg: GuardConfig):
        self.cfg = cfg
        self.history: list[float] = []

    def observe(self, metrics: dict[str, Any]) -> str | None:
        kl = metrics.get("kl")
        if kl is None or not math.isfinite(float(kl)):
            return None
        message = None
        if len(self.history) >= self.cfg.kl_spike_warmup:
            baseline = statistics.median(self.history[-10:])
            if kl >= self.cfg.kl_spike_min and kl > self.cfg.kl_spike_factor * max(baseline, 1e-12):
                message = f"step {metrics.get('step')}: mean KL {kl:.3g} is {kl / max(baseline, 1e-12):.3g}x its recent median {baseline:.3g}"
                log.warning("KL spike: %s", message)
                if self.cfg.kl_spike_action == "stop":
                    raise TrainingHalted(f"KL spike: {message}; stopped, the newest checkpoint is the last good one")
        self.history.append(float(kl))
        return message


def check_disk_space(run_dir: Path, model, margin: float = 1.2) -> None:
    """Fail before training when a checkpoint (weights + Adam state) will not fit in the output directory."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    adam = sum(p.numel() * 4 * 2 for p in model.parameters() if p.requires_grad)
    need = int((weights + adam) * margin)
    free = shutil.disk_usage(run_dir).free
    if free < need:
        raise OSError(f"{run_dir}: a checkpoint needs about {need / 1e9:.2f} GB but only {free / 1e9:.2f} GB are free")
