"""group (GRPO's, the default): each completion's reward minus its group's mean, divided by a standard deviation.

`scale_rewards`, with TRL 1.16's conventions: "group" divides by the group's std, "batch" by the batch's
(PPO-Lite), "none" by nothing (Dr. GRPO); the std is unbiased (n-1) and 1e-4 is added to it before dividing. NaN
rewards (unscorable completions) are left out of means and stds and get advantage 0. Unlike TRL, a group whose
rewards have no spread gets exactly 0 (see base.flat_groups) and counts in `frac_reward_zero_std`.
With `multi_objective_aggregation: normalize_then_sum` the components were already normalised in their groups, and
the sum is centred and scaled over the batch, as TRL (GDPO) does.
"""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.advantages.aggregation import STD_EPSILON
from vlm_grpo.grpo.algorithm.advantages.base import (
    AdvantageEstimator,
    RewardScores,
    flat_groups,
    nanstd,
    register,
    reward_metrics,
)

SCALE_REWARDS = ("group", "batch", "none")


def group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group"
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages [N] for group-contiguous rewards [N], and metrics (see reward_metrics)."""
    scale_rewards = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)  # TRL's booleans
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS} (or True/False), got {scale_rewards!r}.")
    if not isinstance(num_generations, int) or isinstance(num_generations, bool) or num_generations < 1:
        raise ValueError(f"num_generations must be a positive int, got {num_generations!r}.")
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor [N], got shape {tuple(rewards.shape)}.")
    n = rewards.numel()
    if n == 0 or n % num_generations != 0:
        raise ValueError(
            f"The number of rewards ({n}) must be a positive multiple of num_generations ({num_generations}): "
            "rewards are laid out group-contiguous, G completions per prompt."
        )
    rewards = rewards.detach() if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())

    grouped = rewards.view(-1, num_generations)
    group_std = nanstd(grouped, dim=1) if num_generations > 1 else torch.zeros(grouped.shape[0], dtype=rewards.dtype)
    centered = rewards - torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards == "group":
        advantages = centered / (group_std.repeat_interleave(num_generations) + STD_EPSILON)
    elif scale_rewards == "batch":
        batch_std = nanstd(rewards) if n > 1 else torch.zeros((), dtype=rewards.dtype)
        advantages = centered / (batch_std + STD_EPSILON)
    else:
        advantages = centered
    # no signal (all equal, or TRL's own zero test): exactly 0; fewer than two scorable rewards: NaN std, 0 too
    zero_std = flat_groups(grouped) | torch.isclose(group_std, torch.zeros_like(group_std))
    advantages = torch.where(zero_std.repeat_interleave(num_generations), torch.zeros_like(advantages), advantages)
    return torch.nan_to_num(advantages, nan=0.0), reward_metrics(rewards, num_generations)


def batch_normalised(total: torch.Tensor) -> torch.Tensor:
    """(total - batch mean) / (batch std + 1e-4), NaN rows 0: TRL's normalize_then_sum advantages."""
    std = nanstd(total) if total.numel() > 1 else torch.zeros((), dtype=total.dtype)
    return torch.nan_to_num((total - torch.nanmean(total)) / (std + STD_EPSILON), nan=0.0)


@register
class GroupRelative(AdvantageEstimator):
    name = "group"
    summary = "reward minus the group's mean, over the group's (or batch's) std per scale_rewards"
    paper = "DeepSeekMath (GRPO), arXiv:2402.03300; Dr. GRPO arXiv:2503.20783 (scale_rewards none)"

    def estimate(self, scores: RewardScores, mask: torch.Tensor, cfg) -> tuple[torch.Tensor, dict[str, float]]:
        advantages, metrics = group_advantages(scores.total, scores.num_generations, cfg.scale_rewards)
        if cfg.multi_objective_aggregation == "normalize_then_sum":
            advantages = batch_normalised(scores.total)
        return advantages, metrics
