"""rloo: REINFORCE Leave-One-Out: each completion's reward minus the mean of the *other* G-1 rewards of its group.

A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) x (r_i - mean), as verl computes it; no std scaling. Unscorable
completions (NaN) are left out of their group's baseline (the leave-one-out mean of the scorable others) and get 0.
"""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.advantages.base import AdvantageEstimator, RewardScores, register, reward_metrics


@register
class RLOO(AdvantageEstimator):
    name = "rloo"
    summary = "reward minus the mean of the other G-1 rewards of its group"
    paper = "Ahmadian et al. 2024, arXiv:2402.14740"

    def estimate(self, scores: RewardScores, mask: torch.Tensor, cfg) -> tuple[torch.Tensor, dict[str, float]]:
        total, g = scores.total, scores.num_generations
        grouped = total.view(-1, g)
        present = ~torch.isnan(grouped)
        count = present.sum(dim=1, keepdim=True)
        summed = torch.nansum(grouped, dim=1, keepdim=True)
        others = (summed - grouped) / (count - 1).clamp(min=1)  # the leave-one-out mean
        advantages = torch.where(present & (count > 1), grouped - others, torch.zeros_like(grouped))
        return advantages.reshape(-1), reward_metrics(total, g)
