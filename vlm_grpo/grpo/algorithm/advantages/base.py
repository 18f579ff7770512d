"""What an advantage estimator is: a registered class that turns one step's rewards into advantages.

Rows are group-contiguous: prompt i's G completions are rows i*G .. i*G+G-1. An estimator gets `RewardScores`
(the weighted total per completion, NaN where no reward applies, each component, the weights) and the completion
mask, and returns advantages, [N] (one per completion) or [N, T] (one per token), plus metrics. Unscorable
completions (NaN total) get advantage 0 from every estimator, as in TRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from vlm_grpo.grpo.algorithm.registry import Registry

@dataclass
class RewardScores:
    total: torch.Tensor  # [N] sum of weight x component over the components present (NaN: none applies)
    components: torch.Tensor  # [N, K] each reward's raw score (NaN: not applicable)
    weights: torch.Tensor  # [K]
    num_generations: int  # G


class AdvantageEstimator:
    name: ClassVar[str]
    summary: ClassVar[str]
    paper: ClassVar[str]

    def estimate(self, scores: RewardScores, mask: torch.Tensor, cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """(advantages [N] or [N, T], metrics) for completion mask [N, T]; `cfg` is the run's TrainConfig."""
        raise NotImplementedError


# advantage -> class: the files of this folder (registered as the package scans it), or `package.module:Class`
ADVANTAGES = Registry("advantage estimator", "advantage", lambda: AdvantageEstimator)


def register(cls: type[AdvantageEstimator]) -> type[AdvantageEstimator]:
    return ADVANTAGES.add(cls)


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased (n-1) std ignoring NaNs; NaN where fewer than two values are present (TRL's nanstd, plus the guard)."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim)
    var = torch.nanmean((x - mean) ** 2, dim=dim) * (count / (count - 1).clamp(min=1))  # Bessel's correction
    var = torch.where(count > 1, var, torch.full_like(var, float("nan")))
    return var.sqrt()


def flat_groups(grouped: torch.Tensor) -> torch.Tensor:
    """[B] True for groups whose scorable rewards are all equal (at least two of them).

    Tested exactly: the float mean of identical values can round away from them (7 x 1/3 in fp32 leaves a 3e-8
    residue that TRL divides by std + 1e-4; 7 x (1e6 + 0.3) leaves 0.0625), which would give every member of a group
    without signal a sizeable advantage."""
    nan = torch.isnan(grouped)
    flat = grouped.masked_fill(nan, float("-inf")).amax(dim=1) == grouped.masked_fill(nan, float("inf")).amin(dim=1)
    return flat & ((~nan).sum(dim=1) > 1)


def reward_metrics(total: torch.Tensor, num_generations: int) -> dict[str, float]:
    """`reward_mean`, `reward_std` over the batch (NaNs ignored) and `frac_reward_zero_std` (groups with no signal)."""
    grouped = total.view(-1, num_generations)
    std = nanstd(grouped, dim=1) if num_generations > 1 else torch.zeros(grouped.shape[0], dtype=total.dtype)
    zero_std = flat_groups(grouped) | torch.isclose(std, torch.zeros_like(std))
    finite = ~torch.isnan(total)
    return {
        "frac_reward_zero_std": zero_std.float().mean().item(),
        "reward_mean": torch.nanmean(total).item() if finite.any() else float("nan"),
        "reward_std": nanstd(total).item() if int(finite.sum()) > 1 else 0.0,
    }


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) over the masked entries, var unbiased (verl's masked_whiten)."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count
    var = (((values - mean) ** 2) * mask).sum() / count
    var = var * count / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps)
