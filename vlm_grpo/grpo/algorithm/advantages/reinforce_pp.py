"""reinforce_pp: REINFORCE++ (verl's `reinforce_plus_plus`): no per-prompt baseline; the outcome reward is every
token's return (gamma 1), and the returns are whitened over all training tokens of the batch (masked mean and
unbiased variance: (R - mean) / sqrt(var + 1e-8)). Advantages are per token ([N, T]); longer completions weigh more
in the statistics. Unscorable completions (NaN) take no part and get 0."""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.advantages.base import (
    AdvantageEstimator,
    RewardScores,
    masked_whiten,
    register,
    reward_metrics,
)


def whitened_returns(per_row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's value as every one of its tokens' return, whitened over the batch's tokens ([N, T])."""
    scorable = ~torch.isnan(per_row)
    mask = mask.to(per_row.dtype) * scorable.unsqueeze(1).to(per_row.dtype)
    if mask.sum() == 0:
        return torch.zeros_like(mask)
    returns = torch.nan_to_num(per_row, nan=0.0).unsqueeze(1) * mask
    return masked_whiten(returns, mask) * mask


@register
class ReinforcePlusPlus(AdvantageEstimator):
    name = "reinforce_pp"
    summary = "the reward as every token's return, whitened over the batch's tokens (no group baseline)"
    paper = "REINFORCE++, arXiv:2501.03262"

    def estimate(self, scores: RewardScores, mask: torch.Tensor, cfg) -> tuple[torch.Tensor, dict[str, float]]:
        return whitened_returns(scores.total, mask), reward_metrics(scores.total, scores.num_generations)
