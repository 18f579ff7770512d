"""What a policy loss is: a registered class that turns importance ratios and advantages into a per-token loss.

A loss module declares one subclass of `PolicyLoss` with `@register`. The class says:
- `name` (the `loss_type` value), `summary` and `paper` (the tables of README and docs/algorithms.md, `--help`);
- `trl_loss_type`: TRL's loss_type with the same arithmetic, if any (the TRL parity tests then cover it);
- `normalisation`: how its masked per-token losses become one number (`NORMALISATIONS`);
- `settings`: the names of the loss section's options that only it reads (fields of `LossConfig`, config.py,
  written out there with their help and range; the docs tables list them as the loss's own);
- `sums_sequence_ratio`: True when it sums the per-token terms of a sequence (a sequence-level ratio then weights
  each sequence by its length: the settings warn, as TRL 1.16 does);
- `check(cfg)`: combinations of settings it refuses (each named with the one it clashes with);
- `per_token(terms, cfg)`: the loss per token ([R, T], or [R, 1] for one value per sequence) and tensors for its
  metrics, which `metrics(tensors, stats)` turns into logged numbers (default: each tensor's masked mean).
Everything shared by every loss (ratios, KL, masks, the entropy bonus, aggregation) is objective.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vlm_grpo.grpo.algorithm.registry import Registry
from vlm_grpo.grpo.setting_fields import SettingError

# How a loss's masked sum is normalised (m: the loss mask of one micro-batch of R rows).
NORMALISATIONS = {
    "sequence": "mean over sequences of each sequence's token mean: mean_i(sum_t m*l / sum_t m)",
    "tokens": "sum(m*l) / sum(m) over the micro-batch's tokens",
    "max_length": "sum(m*l) / (R * max_completion_length)",
    "step_tokens": "sum(m*l) / the completion tokens of the whole step (all micro-batches and processes)",
    "sequence_sum": "mean over sequences of each sequence's token sum: mean_i(sum_t m*l)",
}

@dataclass
class LossTerms:
    """What a loss sees for one micro-batch of R completion rows, T tokens wide."""

    logps: torch.Tensor  # [R, T] the policy's log-probs of the sampled tokens (with gradient)
    old_logps: torch.Tensor  # [R, T] the sampling policy's (the policy's own, detached, when on-policy)
    log_ratio: torch.Tensor  # [R, T] logps - old_logps
    ratio: torch.Tensor  # [R, T] per token, or [R, 1] per sequence (importance_sampling_level)
    advantages: torch.Tensor  # [R, 1] or [R, T]
    mask: torch.Tensor  # [R, T] float, 1 on the tokens that train


class PolicyLoss:
    name: ClassVar[str]
    summary: ClassVar[str]
    paper: ClassVar[str]
    normalisation: ClassVar[str]
    settings: ClassVar[tuple[str, ...]] = ()
    sums_sequence_ratio: ClassVar[bool] = False
    trl_loss_type: ClassVar[str | None] = None  # TRL 1.16's loss_type with the same arithmetic (tests compare them)

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Refuse settings this loss cannot honour (raise SettingError naming both settings)."""

    def per_token(self, terms: LossTerms, cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def metrics(self, tensors: dict[str, torch.Tensor], stats: "MetricStats") -> dict[str, float]:
        return {name: stats.mean(x) for name, x in tensors.items()}


class MetricStats:
    """Masked statistics of [R, T] (per token) or [R, 1] (per sequence) tensors, over all processes."""

    def __init__(self, mask: torch.Tensor, reduce_sum, gather):
        self.mask, self._reduce_sum, self._gather = mask, reduce_sum, gather

    def mean(self, x: torch.Tensor) -> float:
        x = x.detach().to(self.mask.dtype)
        if x.shape[1] == 1:  # one value per sequence: a plain mean over sequences
            local = torch.stack([x.sum(), torch.tensor(float(x.shape[0]), dtype=x.dtype, device=x.device)])
        else:
            local = torch.stack([(x * self.mask).sum(), self.mask.sum()])
        total = self._reduce_sum(local)
        return (total[0] / total[1].clamp(min=1.0)).item()

    def per_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """Each sequence's token mean (NaN for an empty one), gathered from every process."""
        x = x.detach().to(self.mask.dtype)
        seq = x.squeeze(1) if x.shape[1] == 1 else (x * self.mask).sum(-1) / self.mask.sum(-1)
        return self._gather(seq)


def _check(cls: type[PolicyLoss], imported: bool) -> None:
    """The same rules for a registered class and one imported by path (whether its settings are fields of the loss
    section is checked when the settings are read: LossConfig)."""
    normalisation = getattr(cls, "normalisation", None)
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"loss {cls.__name__}: normalisation {normalisation!r} is not one of {list(NORMALISATIONS)}")
    names = getattr(cls, "settings", ())
    if not isinstance(names, (tuple, list, dict)) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"loss {cls.__name__}: settings {names!r} is not a tuple of the loss section's field names")


# loss_type -> class: the files of this folder (registered as the package scans it), or `package.module:Class`
LOSSES = Registry("loss", "loss_type", lambda: PolicyLoss, _check)


def register(cls: type[PolicyLoss]) -> type[PolicyLoss]:
    return LOSSES.add(cls)


def require_level(loss: str, level: str, cfg: Any) -> None:
    """A loss defined only at one importance-sampling level refuses the other, naming both settings."""
    if cfg.importance_sampling_level != level:
        raise SettingError("importance_sampling_level", f"{cfg.importance_sampling_level!r} with loss_type "
                           f"{loss!r}: {loss} is defined with importance_sampling_level {level!r}")
