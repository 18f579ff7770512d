"""The estimators and the loss TRL does not have, against references written here from their papers' formulas and
verl's definitions (plain Python loops over rows and tokens, float64): RLOO, REINFORCE++, REINFORCE++ with a
baseline, GMPO."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES, reward_scores
from vlm_grpo.grpo.algorithm.losses import LOSSES, LossConfig, LossInputs, policy_loss
from vlm_grpo.grpo.algorithm.losses.config import IMPORTANCE_SAMPLING_LEVELS
from vlm_grpo.grpo.setting_fields import SettingError

TOL = 1e-10
G = 4
LENGTHS = [5, 2, 7, 7, 3, 1, 6, 4, 7, 2, 5, 3]  # 3 groups of 4 completions, T = 7
T = 7
CFG = SimpleNamespace(scale_rewards="group", multi_objective_aggregation="sum_then_normalize")


def _rewards(seed: int = 0, nan_rows=(6,)) -> torch.Tensor:
    rewards = torch.randn(len(LENGTHS), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for row in nan_rows:
        rewards[row] = float("nan")  # no reward applies: left out of every statistic, advantage 0
    return rewards


def _mask() -> torch.Tensor:
    return (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).double()


def _estimate(name: str, rewards: torch.Tensor) -> torch.Tensor:
    scores = reward_scores({"r": rewards}, [1.0], G)
    advantages, metrics = ADVANTAGES[name]().estimate(scores, _mask(), CFG)
    assert metrics["reward_mean"] == pytest.approx(torch.nanmean(rewards).item(), abs=TOL)
    return advantages


def test_every_estimator_says_what_it_is():
    assert ADVANTAGES
    for name, cls in ADVANTAGES.items():
        assert cls.name == name and cls.summary and cls.paper


# ---------------------------------------------------------------- every registered part: what the loop relies on


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_every_estimator_ranks_a_group_s_completions_by_reward(name):
    """[N] or [N, T] finite advantages; 0 for an unscorable completion and on padding; within a group a higher
    reward never gets a lower advantage, and the best completion gets more than the worst."""
    rewards = _rewards(5)
    advantages = _estimate(name, rewards)
    assert advantages.shape in ((len(LENGTHS),), (len(LENGTHS), T)) and torch.isfinite(advantages).all()
    if advantages.dim() == 2:
        assert torch.all(advantages[_mask() == 0] == 0)
        advantages = advantages[:, 0]  # every completion has a first token; its advantage carries the ranking
    assert advantages[6] == 0
    for start in (0, 8):  # the groups without an unscorable member
        group, scores = rewards[start : start + G], advantages[start : start + G]
        order = torch.argsort(group)
        assert torch.all(scores[order].diff() >= -TOL) and scores[order[-1]] > scores[order[0]]


def _loss_config(name: str, **kw) -> LossConfig:
    """The loss's settings at the importance-sampling level it takes (a loss may be defined at one only)."""
    for level in IMPORTANCE_SAMPLING_LEVELS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TRL's advice on some combinations (tested with TRL's losses)
                return LossConfig(loss_type=name, importance_sampling_level=level, **kw)
        except SettingError:
            continue
    raise AssertionError(f"{name} takes no importance-sampling level")


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_raises_the_likelihood_of_an_advantaged_completion_only(name):
    """On-policy, one completion with advantage +1 and the others 0: a descent step raises that completion's
    log-probs and leaves the others' and the padding's alone; with every advantage 0 there is no gradient."""
    mask = _mask()
    logps = torch.full((len(LENGTHS), T), -1.0, dtype=torch.float64, requires_grad=True)
    advantages = torch.zeros(len(LENGTHS), dtype=torch.float64)
    advantages[2] = 1.0
    loss, metrics = policy_loss(LossInputs(logps, advantages, mask), _loss_config(name, max_completion_length=T))
    (grad,) = torch.autograd.grad(loss, logps)
    assert torch.isfinite(loss) and metrics["loss"] == pytest.approx(loss.item())
    assert torch.all(grad[2][mask[2] > 0] < 0)  # minus the gradient points up every trained token's log-prob
    others = torch.ones(len(LENGTHS), dtype=torch.bool)
    others[2] = False
    assert torch.all(grad[others] == 0) and torch.all(grad[mask == 0] == 0)
    flat, _ = policy_loss(LossInputs(logps, torch.zeros_like(advantages), mask), _loss_config(name))
    assert torch.all(torch.autograd.grad(flat, logps)[0] == 0)


def rloo_reference(rewards: list[float], g: int) -> list[float]:
    """Ahmadian et al. 2024, eq. (RLOO): A_i = r_i - 1/(k-1) sum_{j != i} r_j, over the scorable members of the group."""
    out = []
    for start in range(0, len(rewards), g):
        group = rewards[start : start + g]
        present = [r for r in group if not math.isnan(r)]
        for r in group:
            if math.isnan(r) or len(present) < 2:
                out.append(0.0)
            else:
                out.append(r - (sum(present) - r) / (len(present) - 1))
    return out


def test_rloo_is_the_leave_one_out_baseline():
    rewards = _rewards()
    ours = _estimate("rloo", rewards)
    assert ours.shape == rewards.shape
    torch.testing.assert_close(ours, torch.tensor(rloo_reference(rewards.tolist(), G), dtype=torch.float64),
                               atol=TOL, rtol=0)
    # verl's closed form, on the groups with no unscorable member: G/(G-1) x (r - the group's mean)
    grouped = rewards.view(-1, G)
    closed = G / (G - 1) * (grouped - grouped.mean(1, keepdim=True))
    torch.testing.assert_close(ours.view(-1, G)[[0, 2]], closed[[0, 2]], atol=TOL, rtol=0)
    assert ours[6] == 0 and ours.abs().min() < ours.abs().max()


def whiten_reference(values: list[list[float]], mask: list[list[float]]) -> list[list[float]]:
    """verl's masked_whiten: (x - masked mean) / sqrt(unbiased masked variance + 1e-8), over every masked token."""
    xs = [v for row, m in zip(values, mask) for v, k in zip(row, m) if k]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) * k for v, k in zip(row, m)] for row, m in zip(values, mask)]


def returns_reference(outcomes: list[float], mask: list[list[float]], gamma: float = 1.0) -> list[list[float]]:
    """verl's REINFORCE++ returns: the outcome reward sits on each completion's last token; each token's return is the
    discounted sum of the rewards after it (gamma 1), reset after the end of the completion."""
    out = []
    for r, m in zip(outcomes, mask):
        last = max(t for t, k in enumerate(m) if k) if any(m) else -1
        token_rewards = [r if t == last else 0.0 for t in range(len(m))]
        returns, running = [0.0] * len(m), 0.0
        for t in reversed(range(len(m))):
            running = token_rewards[t] + gamma * running
            returns[t] = running
            running *= m[t]
        out.append(returns)
    return out


def _scorable_mask(rewards: torch.Tensor) -> list[list[float]]:
    return [[k * (not math.isnan(r)) for k in row] for r, row in zip(rewards.tolist(), _mask().tolist())]


def test_reinforce_pp_whitens_the_outcome_returns_over_the_batch_tokens():
    rewards = _rewards(1)
    ours = _estimate("reinforce_pp", rewards)
    assert ours.shape == (len(LENGTHS), T)
    mask = _scorable_mask(rewards)
    want = whiten_reference(returns_reference([0.0 if math.isnan(r) else r for r in rewards.tolist()], mask), mask)
    torch.testing.assert_close(ours, torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    assert torch.all(ours[6] == 0) and torch.all(ours[_mask() == 0] == 0)
    trained = ours[torch.tensor(mask) > 0]
    assert abs(trained.mean().item()) < 1e-12 and trained.std().item() == pytest.approx(1.0, abs=1e-6)


def test_reinforce_pp_baseline_subtracts_the_group_mean_first():
    rewards = _rewards(2)
    ours = _estimate("reinforce_pp_baseline", rewards)
    mask = _scorable_mask(rewards)
    centred = []
    for start in range(0, len(LENGTHS), G):
        group = [r for r in rewards.tolist()[start : start + G]]
        present = [r for r in group if not math.isnan(r)]
        centred += [0.0 if math.isnan(r) else r - sum(present) / len(present) for r in group]
    want = whiten_reference(returns_reference(centred, mask), mask)
    torch.testing.assert_close(ours, torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    # the baseline matters: without it the advantages differ
    assert (ours - _estimate("reinforce_pp", rewards)).abs().max() > 0.1


def gmpo_reference(logps, old, advantages, mask, clip: float) -> torch.Tensor:
    """GMPO (arXiv:2507.20673), the objective per sequence: A x (prod_t min/max(r_t, clip(r_t, e^-c, e^c)))^(1/|o|),
    min for A > 0 and max for A < 0 (the pessimistic bound either way); the loss is minus its mean over sequences."""
    terms = []
    for i in range(logps.shape[0]):
        a = float(advantages[i])
        tokens = [t for t in range(logps.shape[1]) if mask[i, t]]
        if not tokens or a == 0.0:
            terms.append(logps[i, 0] * 0.0)
            continue
        kept = []
        for t in tokens:
            log_ratio = logps[i, t] - old[i, t]
            clipped = torch.clamp(log_ratio, -clip, clip)
            kept.append(torch.minimum(log_ratio, clipped) if a > 0 else torch.maximum(log_ratio, clipped))
        terms.append(a * torch.exp(torch.stack(kept).mean()))
    return -torch.stack(terms).mean()


@pytest.mark.parametrize("clip", [0.4, 0.1])
def test_gmpo_matches_the_paper_s_objective_and_gradient(clip):
    g = torch.Generator().manual_seed(3)
    rows = len(LENGTHS)
    logits = torch.randn(rows, T, 9, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(9, (rows, T), generator=g)
    mask = _mask()
    mask[5] = 0  # an empty row (e.g. a truncated completion masked out)

    def logps():
        return torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)

    old = logps().detach() + 0.3 * torch.randn(rows, T, generator=g, dtype=torch.float64)
    advantages = torch.randn(rows, generator=g, dtype=torch.float64)
    advantages[3] = 0.0
    cfg = LossConfig(loss_type="gmpo", gmpo_clip=clip)
    ours, metrics = policy_loss(LossInputs(logps(), advantages, mask, old_logps=old), cfg)
    (grad_ours,) = torch.autograd.grad(ours, logits)
    want = gmpo_reference(logps(), old, advantages, mask, clip)
    (grad_want,) = torch.autograd.grad(want, logits)
    assert abs(ours.item() - want.item()) <= TOL
    assert (grad_ours - grad_want).abs().max().item() <= TOL and grad_want.abs().max() > 1e-3
    # the clipped share: tokens whose pessimistic bound is the clipped log ratio, over the training tokens
    log_ratio = (logps() - old).detach()
    sign = torch.sign(advantages)[:, None]
    binding = (sign * torch.clamp(log_ratio, -clip, clip) < sign * log_ratio) & (sign != 0) & mask.bool()
    assert metrics["gmpo/clip_fraction"] == pytest.approx((binding.sum() / mask.sum()).item(), abs=TOL)
    assert 0 < metrics["gmpo/clip_fraction"] < 1


def test_gmpo_on_policy_is_minus_the_mean_advantage_of_non_empty_rows():
    advantages = torch.tensor([1.0, -2.0, 0.5, 3.0])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    loss, _ = policy_loss(LossInputs(torch.zeros(4, 3, requires_grad=True), advantages, mask),
                          LossConfig(loss_type="gmpo"))
    assert loss.item() == pytest.approx(-(1.0 - 2.0 + 3.0) / 4, abs=1e-7)
