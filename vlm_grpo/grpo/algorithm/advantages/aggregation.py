"""Several rewards into one score per completion (TRL's `multi_objective_aggregation`).

- `sum_then_normalize` (default): the weighted sum of the components present (NaN when none applies); the
  estimator then normalises it.
- `normalize_then_sum` (GDPO): each component is first normalised within its group, (r_k - mean_k) /
  (std_k + 1e-4), then the weighted sum is taken, so a reward with a large scale cannot drown a small one.
"""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.advantages.base import RewardScores, nanstd

MULTI_OBJECTIVE = ("sum_then_normalize", "normalize_then_sum")
STD_EPSILON = 1e-4  # added to the std before dividing, as TRL does


def reward_scores(components: dict[str, torch.Tensor], weights: list[float], num_generations: int,
                  aggregation: str = "sum_then_normalize") -> RewardScores:
    """components: each reward's raw scores [N] (NaN: not applicable), in the order of `weights`."""
    if aggregation not in MULTI_OBJECTIVE:
        raise ValueError(f"multi_objective_aggregation must be one of {MULTI_OBJECTIVE}, got {aggregation!r}")
    stacked = torch.stack(list(components.values()), dim=1)  # [N, K]
    stacked = stacked if stacked.is_floating_point() else stacked.float()  # float64 scores stay float64
    w = torch.tensor(weights, dtype=stacked.dtype)
    unscorable = torch.isnan(stacked).all(dim=1)
    values = stacked
    if aggregation == "normalize_then_sum":
        grouped = stacked.view(-1, num_generations, stacked.shape[1])
        mean = torch.nanmean(grouped, dim=1, keepdim=True)
        std = nanstd(grouped, dim=1).unsqueeze(1) if num_generations > 1 else torch.zeros_like(mean)
        values = ((grouped - mean) / (std + STD_EPSILON)).view_as(stacked)
    total = (values * w).nansum(dim=1)
    total[unscorable] = float("nan")
    return RewardScores(total=total, components=stacked, weights=w, num_generations=num_generations)
