"""Group advantages on hand-worked numbers: group/batch/none scaling, flat groups, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from vlm_grpo.grpo.algorithm.advantages.group import group_advantages

EPS = 1e-4  # TRL's: adv = (r - mean) / (std + 1e-4)


def test_two_groups_group_scaling_by_hand():
    # Group 0: [1, 2, 3] -> mean 2, unbiased std 1. Group 1: [5, 5, 5] -> no spread.
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    adv, metrics = group_advantages(rewards, num_generations=3)
    expected = torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]) / (1.0 + EPS)
    torch.testing.assert_close(adv, expected, atol=1e-7, rtol=0)
    assert torch.all(adv[3:] == 0)
    assert metrics["frac_reward_zero_std"] == 0.5
    assert metrics["reward_mean"] == pytest.approx(3.5)
    # Deviations from 3.5: -2.5 -1.5 -0.5 1.5 1.5 1.5 -> sum of squares 15.5, /(6-1).
    assert metrics["reward_std"] == pytest.approx(math.sqrt(15.5 / 5))


def test_unbiased_std_pairs():
    # Pair [0, 1]: mean 0.5, unbiased std sqrt(0.5) (the biased one would be 0.5 and give +-1/(0.5+eps)*0.5).
    rewards = torch.tensor([0.0, 1.0, 4.0, 0.0])
    adv, metrics = group_advantages(rewards, num_generations=2)
    s0, s1 = math.sqrt(0.5), math.sqrt(8.0)
    expected = torch.tensor([-0.5 / (s0 + EPS), 0.5 / (s0 + EPS), 2.0 / (s1 + EPS), -2.0 / (s1 + EPS)])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    assert metrics["frac_reward_zero_std"] == 0.0


def test_batch_and_none_scaling_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    centered = torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    adv, metrics = group_advantages(rewards, 3, scale_rewards="batch")
    torch.testing.assert_close(adv, centered / (math.sqrt(15.5 / 5) + EPS), atol=1e-7, rtol=0)
    assert metrics["frac_reward_zero_std"] == 0.5  # counted per group whatever the scaling
    adv, _ = group_advantages(rewards, 3, scale_rewards="none")
    torch.testing.assert_close(adv, centered, atol=0, rtol=0)
    # TRL's boolean spellings.
    torch.testing.assert_close(group_advantages(rewards, 3, scale_rewards=False)[0], centered, atol=0, rtol=0)
    torch.testing.assert_close(group_advantages(rewards, 3, True)[0], group_advantages(rewards, 3, "group")[0])


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("value", [0.1, 1 / 3, 0.7, -2.9, 1e6 + 0.3])
def test_flat_group_is_exactly_zero(value, scale_rewards):
    # A mean of identical floats can round off the value; the advantage must still be exactly 0.
    rewards = torch.tensor([value] * 7 + [0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    adv, metrics = group_advantages(rewards, 7, scale_rewards)
    assert torch.all(adv[:7] == 0)
    assert torch.all(adv[7:] != 0)
    assert metrics["frac_reward_zero_std"] == 0.5


def test_all_flat_and_single_generation():
    adv, metrics = group_advantages(torch.ones(8), 4)
    assert torch.all(adv == 0) and metrics["frac_reward_zero_std"] == 1.0 and metrics["reward_std"] == 0.0
    adv, metrics = group_advantages(torch.tensor([0.0, 3.0]), 1)
    assert torch.all(adv == 0) and metrics["frac_reward_zero_std"] == 1.0


def test_integer_and_nan_rewards():
    adv, _ = group_advantages(torch.tensor([0, 1, 1, 1]), 2)
    assert adv.dtype == torch.get_default_dtype()
    torch.testing.assert_close(adv[:2], torch.tensor([-0.5, 0.5]) / (math.sqrt(0.5) + EPS))
    # A NaN reward (unscorable) is left out of its group's mean/std and gets advantage 0.
    adv, metrics = group_advantages(torch.tensor([float("nan"), 1.0, 3.0, 0.0, 0.0, 0.0]), 3)
    torch.testing.assert_close(adv[:3], torch.tensor([0.0, -1.0, 1.0]) / (math.sqrt(2.0) + EPS))
    assert metrics["reward_mean"] == pytest.approx(0.8)
    assert metrics["frac_reward_zero_std"] == 0.5


def test_errors():
    with pytest.raises(ValueError, match=r"multiple of num_generations \(4\)"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(torch.zeros(4), 2, scale_rewards="std")
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="num_generations"):
        group_advantages(torch.zeros(4), 0)
