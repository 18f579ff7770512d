"""The weighted sum of named rewards (both multi-objective aggregations) against TRL 1.16's formulas on the same
scores: non-unit weights, a reward not applicable to some completions (NaN), an unscorable completion."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo.grpo.algorithm.advantages.aggregation import reward_scores

G = 4


def components() -> dict[str, torch.Tensor]:
    accuracy = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, float("nan")])
    form = torch.tensor([0.5, 0.25, float("nan"), 1.0, 0.75, 0.5, 0.0, float("nan")])
    return {"accuracy": accuracy, "format": form}


def trl_total(per_func: torch.Tensor, weights: torch.Tensor, aggregation: str) -> torch.Tensor:
    """grpo_trainer.py's `rewards` before the advantage: weights applied per reward, summed over those present."""
    from trl.trainer.utils import nanstd

    if aggregation == "normalize_then_sum":
        grouped = per_func.view(-1, G, per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        per_func = ((grouped - mean_k) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)).view(-1, per_func.shape[1])
    total = (per_func * weights.unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(per_func).all(dim=1)] = torch.nan
    return total


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_weighted_rewards_sum_as_trls(aggregation):
    weights = [2.0, 0.5]
    got = reward_scores(components(), weights, G, aggregation).total
    want = trl_total(torch.stack(list(components().values()), dim=1), torch.tensor(weights), aggregation)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.isnan(got[-1]) and not torch.isnan(got[:-1]).any()  # only the unscorable row
    if aggregation == "sum_then_normalize":
        assert got[0].item() == pytest.approx(2.0 * 1.0 + 0.5 * 0.5)  # by hand: the weights count
