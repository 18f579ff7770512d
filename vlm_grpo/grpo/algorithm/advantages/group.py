"""Group-relative advantages for GRPO, with TRL 1.16's reward-scaling conventions.

Rewards are laid out group-contiguous: prompt i's `num_generations` completions are rows
`i*G .. i*G+G-1`. The advantage is the reward minus its group's mean, optionally divided by a
standard deviation plus a small epsilon:

- `"group"` (default): the group's std;
- `"batch"`: the std over the whole batch (PPO-Lite);
- `"none"`: no scaling (Dr. GRPO).

The std is the *unbiased* (Bessel-corrected, n-1) estimator and the epsilon is added to the std,
`adv = (r - mean) / (std + 1e-4)`, as in TRL. NaN rewards (unscorable completions) are left out of the
means and stds and get advantage 0, also as in TRL. Unlike TRL, a group whose rewards have no spread
gets an advantage of exactly 0 (TRL divides the float-rounding residue of its mean by std + 1e-4, which
for large rewards is not small) and is counted in `frac_reward_zero_std`.
"""

from __future__ import annotations

import torch

SCALE_REWARDS = ("group", "batch", "none")
STD_EPSILON = 1e-4  # added to the std before dividing, as TRL does


def _nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Unbiased std ignoring NaNs; NaN where fewer than two values are present."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim)
    var = torch.nanmean((x - mean) ** 2, dim=dim) * (count / (count - 1).clamp(min=1))  # Bessel's correction
    var = torch.where(count > 1, var, torch.full_like(var, float("nan")))
    return var.sqrt()


def _resolve_scale(scale_rewards) -> str:
    # TRL's config also accepts booleans: True -> "group", False -> "none".
    if scale_rewards is True:
        return "group"
    if scale_rewards is False:
        return "none"
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS} (or True/False), got {scale_rewards!r}.")
    return scale_rewards


@torch.no_grad()
def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group"
) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantages [N] for group-contiguous rewards [N], and metrics.

    Metrics: `frac_reward_zero_std` (fraction of groups whose reward std is ~0, i.e. that carry no
    learning signal), `reward_mean` and `reward_std` (over the whole batch, NaNs ignored; unbiased std,
    0.0 when fewer than two rewards are present).
    """
    scale = _resolve_scale(scale_rewards)
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
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    rewards = rewards.detach()

    grouped = rewards.view(-1, num_generations)
    group_mean = torch.nanmean(grouped, dim=1)
    if num_generations > 1:
        group_std = _nanstd(grouped, dim=1)
    else:
        group_std = torch.zeros_like(group_mean)
    centered = rewards - group_mean.repeat_interleave(num_generations)

    if scale == "group":
        advantages = centered / (group_std.repeat_interleave(num_generations) + STD_EPSILON)
    elif scale == "batch":
        batch_std = _nanstd(rewards) if n > 1 else torch.zeros((), dtype=rewards.dtype, device=rewards.device)
        advantages = centered / (batch_std + STD_EPSILON)
    else:
        advantages = centered

    # A group has zero spread when its (scorable) rewards are all equal. Tested exactly, because the float
    # mean of identical values can round away from them (e.g. 7 x 1/3 in fp32 leaves a 3e-8 residue that
    # TRL divides by std + 1e-4, and 7 x (1e6 + 0.3) leaves 0.0625, an advantage of ~ -1 for every member).
    # Also TRL's own zero test (isclose(std, 0), |std| <= 1e-8). A group with fewer than two scorable
    # rewards has a NaN std and is not counted, as in TRL (its advantages are 0 all the same).
    nan = torch.isnan(grouped)
    flat = (grouped.masked_fill(nan, float("-inf")).amax(dim=1) == grouped.masked_fill(nan, float("inf")).amin(dim=1))
    flat &= (~nan).sum(dim=1) > 1
    zero_std = flat | torch.isclose(group_std, torch.zeros_like(group_std))
    advantages = torch.where(zero_std.repeat_interleave(num_generations), torch.zeros_like(advantages), advantages)
    advantages = torch.nan_to_num(advantages, nan=0.0)

    finite = ~torch.isnan(rewards)
    reward_mean = torch.nanmean(rewards).item() if finite.any() else float("nan")
    reward_std = _nanstd(rewards).item() if int(finite.sum()) > 1 else 0.0
    metrics = {
        "frac_reward_zero_std": zero_std.float().mean().item(),
        "reward_mean": reward_mean,
        "reward_std": reward_std,
    }
    return advantages, metrics
