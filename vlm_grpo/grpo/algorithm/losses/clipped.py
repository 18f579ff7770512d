"""The PPO-clipped surrogate that grpo, bnpo, dr_grpo, dapo and luspo share (they differ only in normalisation).

-min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A), with INTELLECT-2's two-sided variant when `delta` is
set (the unclipped ratio is capped at delta first), exactly as TRL 1.16 computes it, and TRL's clip metrics.
"""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.losses.base import LossTerms, MetricStats, PolicyLoss


class ClippedSurrogate(PolicyLoss):
    def per_token(self, terms: LossTerms, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ratio, advantages = terms.ratio, terms.advantages
        clipped = torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon_high)
        if cfg.delta is not None:
            ratio = torch.clamp(ratio, max=cfg.delta)
        loss = -torch.min(ratio * advantages, clipped * advantages)
        # "the clip bound is the active term", measured on the (delta-capped) ratio as TRL does
        low = ((ratio < 1 - cfg.epsilon) & (advantages < 0)).float()
        high = ((ratio > 1 + cfg.epsilon_high) & (advantages > 0)).float()
        return loss, {"low": low, "high": high}

    def metrics(self, tensors: dict[str, torch.Tensor], stats: MetricStats) -> dict[str, float]:
        low, high = tensors["low"], tensors["high"]
        return {
            "clip_ratio/low_mean": stats.mean(low),
            "clip_ratio/high_mean": stats.mean(high),
            "clip_ratio/region_mean": stats.mean(torch.maximum(low, high)),
            "clip_ratio/low_min": _extreme(stats.per_sequence(low), torch.min),
            "clip_ratio/high_max": _extreme(stats.per_sequence(high), torch.max),
        }


def _extreme(x: torch.Tensor, fn) -> float:
    """TRL's nanmin / nanmax: empty sequences (NaN) are ignored; NaN when every one is empty."""
    x = x[~torch.isnan(x)]
    return fn(x).item() if x.numel() else float("nan")
