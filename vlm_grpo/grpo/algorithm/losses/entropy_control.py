"""The entropy bonus's coefficient: fixed (`entropy_coef`), or adaptive as in Skywork-OR1 (TRL's
`use_adaptive_entropy`): after each optimizer update, the mean entropy of that update's training tokens (over every
micro-batch and process) moves the coefficient up by `entropy_coef_delta` when it is at or below `entropy_target`,
down otherwise (within `entropy_coef_min` .. `entropy_coef_max`); the bonus applies only while the last measured
entropy is at or below the target (none before the first measurement). Its state is part of a checkpoint."""

from __future__ import annotations

import math

import torch


class EntropyControl:
    def __init__(self, cfg):
        self.cfg = cfg
        self.coef = float(cfg.entropy_coef)
        self.last_entropy = math.inf
        self._window = None  # [entropy sum, token count] of the update's micro-batches so far

    @property
    def enabled(self) -> bool:
        return self.coef != 0.0 or self.cfg.use_adaptive_entropy

    def applied(self) -> float:
        """The coefficient every micro-batch of the current update uses."""
        if self.cfg.use_adaptive_entropy and self.last_entropy > self.cfg.entropy_target:
            return 0.0
        return self.coef

    def observe(self, entropy: torch.Tensor, mask: torch.Tensor) -> None:
        stats = torch.stack([(entropy * mask).sum(), mask.sum()]).detach().double()
        self._window = stats if self._window is None else self._window + stats

    def end_update(self, reduce_sum) -> None:
        """After an optimizer update: adapt the coefficient from the update's entropy (all processes)."""
        if not self.cfg.use_adaptive_entropy or self._window is None:
            self._window = None
            return
        total = reduce_sum(self._window)
        self._window = None
        world = (total[0] / total[1].clamp(min=1.0)).item()
        cfg = self.cfg
        if world <= cfg.entropy_target:
            self.coef = min(self.coef + cfg.entropy_coef_delta, cfg.entropy_coef_max)
        else:
            self.coef = max(self.coef - cfg.entropy_coef_delta, cfg.entropy_coef_min)
        self.last_entropy = world

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
