"""reinforce_pp_baseline: REINFORCE++ with a group baseline (verl's `reinforce_plus_plus_baseline`): the reward minus
its group's mean, as every token's return, whitened over all training tokens of the batch."""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.advantages.base import AdvantageEstimator, RewardScores, register, reward_metrics
from vlm_grpo.grpo.algorithm.advantages.reinforce_pp import whitened_returns


@register
class ReinforcePlusPlusBaseline(AdvantageEstimator):
    name = "reinforce_pp_baseline"
    summary = "reward minus the group's mean as every token's return, whitened over the batch's tokens"
    paper = "REINFORCE++, arXiv:2501.03262 (verl's baseline variant)"

    def estimate(self, scores: RewardScores, mask: torch.Tensor, cfg) -> tuple[torch.Tensor, dict[str, float]]:
        g = scores.num_generations
        grouped = scores.total.view(-1, g)
        centered = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)).reshape(-1)
        return whitened_returns(centered, mask), reward_metrics(scores.total, g)
