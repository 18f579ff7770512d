"""Parity with TRL 1.16's GRPO math, driven through TRL's own code.

Loss: `GRPOTrainer._compute_loss` runs unbound on a stand-in `self` that holds only the attributes it
reads; its one model call, `_get_per_token_logps_and_entropies`, is stubbed to return log-probs computed
from a trainable logits tensor, so all of TRL's loss arithmetic (ratios, clipping, KL, aggregation,
metrics) is TRL's. Our `grpo_loss` gets the same log-probs; losses, gradients w.r.t. the logits and the
clip/KL metrics must agree to 1e-5.

Advantages: TRL computes them inline in `_generate_and_score_completions` (a method that also generates
and scores, so not callable on a stub). The reference below restates grpo_trainer.py lines 2765-2788
(sum_then_normalize branch) using TRL's own `nanstd`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from vlm_grpo.grpo.algorithm.advantages.group import group_advantages  # noqa: E402
from vlm_grpo.grpo.algorithm.losses import LossConfig, policy_loss as grpo_loss  # noqa: E402

TOL = 1e-5
B, T, V = 6, 7, 11
MAX_COMPLETION_LENGTH = 9  # > T, so dr_grpo's constant differs from the padded width
LENGTHS = [7, 3, 5, 1, 0, 6]  # ragged, with a full row and an empty one


class _Accelerator:
    num_processes = 1
    process_index = 0

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    gather_for_metrics = gather


def _trl_self(cfg: LossConfig, logps_fn):
    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        logps = logps_fn()
        assert logps.shape[1] == logits_to_keep
        return logps, torch.zeros_like(logps).detach(), None

    args = SimpleNamespace(
        use_bias_correction_kl=cfg.use_bias_correction_kl,
        delta=cfg.delta,
        steps_per_generation=1,
    )
    return SimpleNamespace(
        _get_per_token_logps_and_entropies=per_token_logps_and_entropies,
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=cfg.importance_sampling_level,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        epsilon_low=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        max_completion_length=cfg.max_completion_length,
        args=args,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        accelerator=_Accelerator(),
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def _case(seed: int, off_policy: bool):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float32).requires_grad_(True)
    completion_ids = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()

    def logps_fn():
        return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)

    base = logps_fn().detach()
    # Sampling-policy log-probs off by ~0.3 nats so both clip bounds are hit; ref further off for a visible KL.
    old = base + 0.3 * torch.randn(B, T, generator=g) if off_policy else None
    ref = base + 0.5 * torch.randn(B, T, generator=g)
    rewards = torch.randn(B, generator=g)
    advantages, _ = group_advantages(rewards, num_generations=3)
    return logits, logps_fn, completion_ids, mask, old, ref, advantages


def _trl_loss(cfg, logps_fn, completion_ids, mask, old, ref, advantages, num_items_in_batch):
    fake = _trl_self(cfg, logps_fn)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "advantages": advantages,
        "num_items_in_batch": torch.tensor(float(num_items_in_batch)),
    }
    if old is not None:
        inputs["old_per_token_logps"] = old
    if cfg.beta != 0.0:
        inputs["ref_per_token_logps"] = ref
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    metrics = {k: v[-1] for k, v in fake._metrics["train"].items()}
    return loss, metrics


def _config(**kw) -> LossConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LossConfig(max_completion_length=MAX_COMPLETION_LENGTH, **kw)


def _compare(cfg: LossConfig, off_policy: bool, seed: int = 0, normalizer=None):
    logits, logps_fn, completion_ids, mask, old, ref, advantages = _case(seed, off_policy)
    num_items = int(mask.sum()) if normalizer is None else normalizer

    trl_loss, trl_metrics = _trl_loss(cfg, logps_fn, completion_ids, mask, old, ref, advantages, num_items)
    (trl_grad,) = torch.autograd.grad(trl_loss, logits)

    ours, metrics = grpo_loss(
        logps_fn(), old, ref if cfg.beta else None, advantages, mask, cfg, normalizer=normalizer
    )
    (our_grad,) = torch.autograd.grad(ours, logits)

    assert torch.isfinite(ours) and ours.dim() == 0
    assert abs(ours.item() - trl_loss.item()) <= TOL, (ours.item(), trl_loss.item())
    assert (our_grad - trl_grad).abs().max().item() <= TOL
    assert trl_grad.abs().max().item() > 1e-3  # a real gradient, not two zeros agreeing

    keys = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]
    keys += ["clip_ratio/low_min", "clip_ratio/high_max"] + (["kl"] if cfg.beta else [])
    for key in keys:
        assert metrics[key] == pytest.approx(trl_metrics[key], abs=TOL, nan_ok=True), key
    assert ("kl" in metrics) == bool(cfg.beta)
    return metrics, trl_grad


@pytest.mark.parametrize("off_policy", [True, False], ids=["off_policy", "on_policy"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_loss_and_grad_match_trl(loss_type, beta, level, off_policy):
    cfg = _config(loss_type=loss_type, beta=beta, importance_sampling_level=level, epsilon_high=0.28)
    metrics, _ = _compare(cfg, off_policy)
    if off_policy:  # the case must exercise clipping, or the clip branch is untested
        assert metrics["clip_ratio/region_mean"] > 0
    else:
        assert metrics["clip_ratio/region_mean"] == 0


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_kl_without_bias_correction_matches_trl(loss_type, level):
    cfg = _config(loss_type=loss_type, beta=0.1, importance_sampling_level=level, use_bias_correction_kl=False)
    _compare(cfg, off_policy=True, seed=1)


def test_two_sided_delta_matches_trl():
    _compare(_config(loss_type="grpo", delta=1.25), off_policy=True, seed=2)


def test_dapo_global_normalizer_matches_trl():
    # A global token count (e.g. summed over processes/accumulation) larger than the local mask sum.
    _, grad_local = _compare(_config(loss_type="dapo"), off_policy=True, seed=3)
    _, grad_global = _compare(_config(loss_type="dapo"), off_policy=True, seed=3, normalizer=3 * sum(LENGTHS))
    torch.testing.assert_close(grad_global * 3, grad_local)


def test_defaults_match_trl_config():
    trl_defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    ours = LossConfig()
    for name in ("loss_type", "epsilon", "beta", "importance_sampling_level", "use_bias_correction_kl", "delta"):
        assert getattr(ours, name) == trl_defaults[name], name
    assert trl_defaults["epsilon_high"] is None and ours.epsilon_high == ours.epsilon


def test_sequence_level_with_token_sum_losses_warns_like_trl():
    # TRL 1.16 accepts importance_sampling_level="sequence" with dapo/dr_grpo and only logs a warning.
    for loss_type in ("dapo", "dr_grpo"):
        with pytest.warns(UserWarning, match="weights each sequence by its completion length"):
            LossConfig(loss_type=loss_type, importance_sampling_level="sequence")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LossConfig(loss_type="grpo", importance_sampling_level="sequence")


def _trl_advantages(rewards: torch.Tensor, G: int, scale_rewards: str) -> tuple[torch.Tensor, float]:
    """grpo_trainer.py L2765-2788 (TRL 1.16, sum_then_normalize), with TRL's nanstd."""
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale_rewards in ("group", "none"):
        std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    else:
        std = nanstd(rewards).expand_as(rewards)
    adv = rewards - mean
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    is_std_zero = torch.isclose(std, torch.zeros_like(std))
    return torch.nan_to_num(adv, nan=0.0), is_std_zero.float().mean().item()


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_advantages_match_trl_formula(scale_rewards):
    g = torch.Generator().manual_seed(4)
    G = 4
    rewards = torch.randn(5 * G, generator=g)
    rewards[G : 2 * G] = 1.0  # one flat group
    rewards[2 * G + 1] = float("nan")  # one unscorable completion
    ours, metrics = group_advantages(rewards, G, scale_rewards)
    ref, ref_frac = _trl_advantages(rewards, G, scale_rewards)
    torch.testing.assert_close(ours, ref, atol=TOL, rtol=0)
    assert ours[2 * G + 1] == 0
    assert torch.all(ours[G : 2 * G] == 0)
    assert metrics["reward_mean"] == pytest.approx(torch.nanmean(rewards).item(), abs=1e-6)
    assert metrics["reward_std"] == pytest.approx(nanstd(rewards).item(), abs=1e-6)
    if scale_rewards != "batch":  # TRL's batch-mode flag is about the batch std; ours always counts groups
        assert metrics["frac_reward_zero_std"] == pytest.approx(ref_frac)
    assert metrics["frac_reward_zero_std"] == pytest.approx(1 / 5)


def test_on_policy_loss_values_by_hand():
    # On-policy with beta=0 the ratio is 1, so each token contributes -A: the three aggregations differ
    # only in their denominators.
    lengths = torch.tensor(LENGTHS)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0, 7.0, -1.0])
    logps = torch.zeros(B, T, requires_grad=True)
    weighted = -(adv * lengths).sum()
    expected = {
        "grpo": -(adv * (lengths > 0)).sum() / B,  # the empty row contributes 0
        "dr_grpo": weighted / (B * MAX_COMPLETION_LENGTH),
        "dapo": weighted / lengths.sum(),
    }
    for loss_type, value in expected.items():
        loss, metrics = grpo_loss(logps, None, None, adv, mask, _config(loss_type=loss_type))
        assert loss.item() == pytest.approx(value.item(), abs=1e-6), loss_type
        assert metrics["clip_ratio/region_mean"] == 0 and "kl" not in metrics
    loss, _ = grpo_loss(logps, None, None, adv, mask, _config(loss_type="dapo"), normalizer=100)
    assert loss.item() == pytest.approx(weighted.item() / 100, abs=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_type": "nope"}, "loss_type"),
        ({"importance_sampling_level": "seq"}, "importance_sampling_level"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"epsilon": -0.1}, "epsilon"),
        ({"epsilon_high": -0.1}, "epsilon_high"),
        ({"beta": -0.01}, "beta"),
        ({"beta": float("nan")}, "beta"),
        ({"max_completion_length": 0}, "max_completion_length"),
        ({"delta": 1.0}, "delta"),
    ],
)
def test_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


def test_config_resolves_epsilon_high():
    assert LossConfig(epsilon=0.1).epsilon_high == 0.1
    assert LossConfig(epsilon=0.1, epsilon_high=0.28).epsilon_high == 0.28


def test_loss_rejects_bad_arguments():
    x = torch.zeros(2, 3)
    adv, mask = torch.zeros(2), torch.ones(2, 3)
    with pytest.raises(ValueError, match="ref_logps is required"):
        grpo_loss(x, None, None, adv, mask, LossConfig(beta=0.04))
    with pytest.raises(ValueError, match="completion_mask must have shape"):
        grpo_loss(x, None, None, adv, torch.ones(2, 4), LossConfig())
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, None, None, torch.zeros(3), mask, LossConfig())
    with pytest.raises(ValueError, match="normalizer"):
        grpo_loss(x, None, None, adv, mask, LossConfig(), normalizer=-1)


def test_normalizer_is_dapo_only_and_clamped():
    logps = torch.zeros(2, 3, requires_grad=True)
    adv, mask = torch.tensor([1.0, -3.0]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    for loss_type in ("grpo", "dr_grpo"):
        cfg = LossConfig(loss_type=loss_type)
        plain, _ = grpo_loss(logps, None, None, adv, mask, cfg)
        given, _ = grpo_loss(logps, None, None, adv, mask, cfg, normalizer=torch.tensor(50.0))
        assert given.item() == plain.item()
    # An all-empty batch: a zero token count is clamped to 1 (TRL: num_items_in_batch.clamp(min=1.0)), not 0/0.
    for normalizer in (None, 0, torch.tensor(0.0)):
        loss, _ = grpo_loss(logps, None, None, adv, torch.zeros(2, 3), LossConfig(), normalizer=normalizer)
        assert loss.item() == 0.0
    loss, _ = grpo_loss(logps, None, None, adv, mask, LossConfig(), normalizer=torch.tensor(0.5))
    assert loss.item() == pytest.approx(1.0)  # -(2*1 + 1*(-3)) / max(0.5, 1)
