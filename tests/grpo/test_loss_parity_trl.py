"""Parity with TRL 1.16's GRPO loss, driven through TRL's own code, in float64.

`GRPOTrainer._compute_loss` runs on a bare `GRPOTrainer` instance (`object.__new__`, no `__init__`) holding only the
attributes it reads; its one model call, `_get_per_token_logps_and_entropies`, is replaced by log-probs and
entropies computed from a trainable float64 logits tensor, so all of TRL's loss arithmetic (entropy mask, off-policy
mask, ratios, clipping, KL, every loss type, aggregation, the entropy bonus and its adaptive coefficient, metrics) is
TRL's. Our `policy_loss` gets the same tensors; losses, gradients w.r.t. the logits and every metric TRL logs must
agree within 1e-10.

Advantages: TRL computes them inline in `_generate_and_score_completions` (a method that also generates and scores,
so not callable on a stand-in). The references below restate grpo_trainer.py's two branches (sum_then_normalize,
normalize_then_sum) with TRL's own `nanstd`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

from vlm_grpo.grpo.algorithm.advantages import reward_scores  # noqa: E402
from vlm_grpo.grpo.algorithm.advantages.group import GroupRelative, group_advantages  # noqa: E402
from vlm_grpo.grpo.algorithm.losses import LOSSES, EntropyControl, LossConfig, LossInputs, policy_loss  # noqa: E402
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate  # noqa: E402
from vlm_grpo.grpo.algorithm.losses.config import IMPORTANCE_SAMPLING_LEVELS  # noqa: E402
from vlm_grpo.grpo.setting_fields import SettingError  # noqa: E402

TOL = 1e-10
# Every registered loss that declares TRL's counterpart: a new loss file joins these loops with nothing else edited.
TRL_LOSSES = tuple(name for name, cls in sorted(LOSSES.items()) if cls.trl_loss_type)
B, T, V, G = 6, 7, 11, 3
MAX_COMPLETION_LENGTH = 9  # > T, so dr_grpo's constant differs from the padded width
LENGTHS = [7, 3, 5, 1, 0, 6]  # ragged: a row cut at the limit (no EOS), an empty one
EOS, PAD = 0, 1


class _Accelerator:
    """One process: TRL's collectives are identities; sync_gradients marks the last micro-batch of an update."""

    num_processes = 1
    process_index = 0
    sync_gradients = True

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    @staticmethod
    def pad_across_processes(x, dim=0, pad_index=0):
        return x

    gather_for_metrics = gather


def _trl_trainer(cfg: LossConfig, accumulation: int = 1) -> GRPOTrainer:
    """A GRPOTrainer without __init__, holding what `_compute_loss` reads (set as TRL's __init__ sets it)."""
    fake = object.__new__(GRPOTrainer)
    fake.args = SimpleNamespace(
        use_bias_correction_kl=cfg.use_bias_correction_kl, delta=cfg.delta, steps_per_generation=accumulation,
        sapo_temperature_pos=cfg.sapo_temperature_pos, sapo_temperature_neg=cfg.sapo_temperature_neg,
        vespo_k_pos=cfg.vespo_k_pos, vespo_lambda_pos=cfg.vespo_lambda_pos, vespo_k_neg=cfg.vespo_k_neg,
        vespo_lambda_neg=cfg.vespo_lambda_neg, entropy_target=cfg.entropy_target,
        entropy_coef_delta=cfg.entropy_coef_delta, entropy_coef_min=cfg.entropy_coef_min,
        entropy_coef_max=cfg.entropy_coef_max,
    )
    fake.aux_loss_enabled = False
    fake.top_entropy_quantile = cfg.top_entropy_quantile
    fake.off_policy_mask_threshold = cfg.off_policy_mask_threshold
    fake.importance_sampling_level = cfg.importance_sampling_level
    fake.beta = cfg.beta
    fake.loss_type = LOSSES[cfg.loss_type].trl_loss_type
    fake.epsilon_low, fake.epsilon_high = cfg.epsilon, cfg.epsilon_high
    fake.max_completion_length = cfg.max_completion_length
    fake.use_vllm = False
    fake.vllm_importance_sampling_correction = False
    fake.model = SimpleNamespace(training=True)
    fake.current_gradient_accumulation_steps = accumulation
    fake.accelerator = _Accelerator()
    fake.entropy_coef = cfg.entropy_coef
    fake.use_adaptive_entropy = cfg.use_adaptive_entropy
    fake._entropy_bonus_enabled = cfg.entropy_coef != 0.0 or cfg.use_adaptive_entropy
    fake._last_world_entropy = float("inf")
    fake._entropy_window_stats = None
    fake._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return fake


def trl_truncated(completion_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's mask_truncated_completions rule (grpo_trainer.py, `_generate_and_score_completions`): a completion whose
    last kept token is neither EOS nor pad was cut at the length limit. (An empty row has no last token: kept.)"""
    eos_and_pad = [EOS, PAD]
    ids = [row[m.bool()].tolist() for row, m in zip(completion_ids, mask)]
    return torch.tensor([bool(r) and r[-1] not in eos_and_pad for r in ids])


@dataclasses.dataclass
class Case:
    logits: torch.Tensor  # [B, T, V] float64, the parameters
    completion_ids: torch.Tensor
    mask: torch.Tensor
    old: torch.Tensor | None
    ref: torch.Tensor
    advantages: torch.Tensor

    def logps(self) -> torch.Tensor:
        return torch.log_softmax(self.logits, -1).gather(-1, self.completion_ids.unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:  # with gradient, as TRL's fused head returns it
        logp = torch.log_softmax(self.logits, -1)
        return -(logp.exp() * logp).sum(-1)


def make_case(seed: int, off_policy: bool = True, truncate: bool = False, scale: float = 1.0) -> Case:
    g = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(B, T, V, generator=g, dtype=torch.float64)).requires_grad_(True)
    completion_ids = torch.randint(2, V, (B, T), generator=g)
    lengths = torch.tensor(LENGTHS)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    ends = (lengths > 0) & (lengths < T)  # these stopped: EOS is their last token, pad after it
    completion_ids[ends, lengths[ends] - 1] = EOS
    completion_ids[mask == 0] = PAD
    if truncate:  # TRL zeroes the completion mask of truncated rows before anything else sees it
        mask = mask * (~trl_truncated(completion_ids, mask)).unsqueeze(1).long()
    base = torch.log_softmax(logits.detach(), -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    # Sampling-policy log-probs off by ~0.3 nats so both clip bounds are hit; ref further off for a visible KL.
    old = base + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64) if off_policy else None
    ref = base + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages, _ = group_advantages(torch.randn(B, generator=g, dtype=torch.float64), num_generations=G)
    advantages[2] = 0.0  # as in a group without spread: the sign-dependent branches see A = 0 too
    return Case(logits, completion_ids, mask, old, ref, advantages)


def trl_loss(fake: GRPOTrainer, case: Case, num_items: float) -> tuple[torch.Tensor, dict[str, float]]:
    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == T
        return case.logps(), case.entropy(), None

    fake._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": case.completion_ids,
        "completion_mask": case.mask,
        "advantages": case.advantages,
        "num_items_in_batch": torch.tensor(float(num_items), dtype=torch.float64),
        "ref_per_token_logps": case.ref,
    }
    if case.old is not None:
        inputs["old_per_token_logps"] = case.old
    before = {k: len(v) for k, v in fake._metrics["train"].items()}
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    logged = {k: v[-1] for k, v in fake._metrics["train"].items() if len(v) > before.get(k, 0)}
    return loss, logged


def our_loss(cfg, case: Case, control: EntropyControl, normalizer=None, share: float = 1.0):
    inputs = LossInputs(case.logps(), case.advantages, case.mask, old_logps=case.old,
                        ref_logps=case.ref if cfg.beta else None, entropy=case.entropy(), normalizer=normalizer,
                        share=share)
    return policy_loss(inputs, cfg, entropy_control=control)


def _refused(**kw) -> bool:
    try:
        _build(**kw)
    except SettingError:
        return True
    return False


def _build(**kw) -> LossConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's advice (sequence level with token sums, cispo's cap) is tested below
        return LossConfig(max_completion_length=MAX_COMPLETION_LENGTH, **kw)


def config(**kw) -> LossConfig:
    """The loss section; a loss defined at one importance-sampling level only (luspo: sequence) gets that level."""
    if "importance_sampling_level" not in kw:
        kw["importance_sampling_level"] = next(level for level in IMPORTANCE_SAMPLING_LEVELS
                                               if not _refused(**kw, importance_sampling_level=level))
    return _build(**kw)


def assert_same(ours, theirs, grad_ours, grad_theirs, metrics, trl_metrics, control):
    assert ours.dim() == 0 and torch.isfinite(ours)
    assert abs(ours.item() - theirs.item()) <= TOL, (ours.item(), theirs.item())
    assert (grad_ours - grad_theirs).abs().max().item() <= TOL
    assert grad_theirs.abs().max().item() > 1e-3  # a real gradient, not two zeros agreeing
    assert "entropy" in trl_metrics  # TRL logs it on every call: the metrics were captured, the loop below is not empty
    for key, value in trl_metrics.items():  # every metric TRL logs, ours under the same name
        mine = control.coef if key == "entropy_coef" else metrics[key]  # stepped by the trainer after the update
        tol = 1e-7 if "clip_ratio" in key else TOL  # TRL averages these 0/1 flags in float32 (`.float()`)
        assert mine == pytest.approx(value, abs=tol, nan_ok=True), key
    assert set(trl_metrics) - {"entropy_coef"} <= set(metrics)


def compare(cfg: LossConfig, case: Case, normalizer=None) -> dict[str, float]:
    num_items = int(case.mask.sum()) if normalizer is None else normalizer
    theirs, trl_metrics = trl_loss(_trl_trainer(cfg), case, num_items)
    (grad_theirs,) = torch.autograd.grad(theirs, case.logits)
    control = EntropyControl(cfg)
    ours, metrics = our_loss(cfg, case, control, normalizer=normalizer)
    (grad_ours,) = torch.autograd.grad(ours, case.logits)
    assert_same(ours, theirs, grad_ours, grad_theirs, metrics, trl_metrics, control)
    return metrics


def _epsilon_high(loss_type: str) -> float:
    return 1.2 if loss_type == "cispo" else 0.28  # cispo's cap is on the ratio itself (ScaleRL: 5.0)


def test_every_loss_trl_has_is_compared_with_trl():
    """TRL 1.16's loss types (GRPOConfig's help lists them) each have a registered loss declaring it."""
    help_text = next(f for f in dataclasses.fields(GRPOConfig) if f.name == "loss_type").metadata["help"]
    supported = help_text.split("Supported values are ", 1)[1].split(".", 1)[0]
    assert set(re.findall(r"'(\w+)'", supported)) == {LOSSES[name].trl_loss_type for name in TRL_LOSSES}
    for name, cls in LOSSES.items():
        assert cls.name == name and cls.summary and cls.paper


@pytest.mark.parametrize("off_policy", [True, False], ids=["off_policy", "on_policy"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", TRL_LOSSES)
def test_loss_and_grad_match_trl(loss_type, beta, off_policy):
    clip_range = dict(epsilon_high=_epsilon_high(loss_type))
    if config(loss_type=loss_type).importance_sampling_level == "sequence":  # a sequence's mean log ratio moves less
        clip_range = dict(epsilon=0.05, epsilon_high=0.05)  # than a token's: a narrower range, so that it clips
    cfg = config(loss_type=loss_type, beta=beta, **clip_range)
    metrics = compare(cfg, make_case(0, off_policy))
    if issubclass(LOSSES[loss_type], ClippedSurrogate):  # the case must exercise clipping, or that branch is untested
        assert (metrics["clip_ratio/region_mean"] > 0) == off_policy
    assert ("kl" in metrics) == bool(beta)


OPTIONS = {
    "delta": dict(delta=1.1),
    "top_entropy_quantile": dict(top_entropy_quantile=0.5),
    "mask_truncated_completions": dict(mask_truncated_completions=True),
    "off_policy_mask_threshold": dict(off_policy_mask_threshold=0.01),
    "entropy_coef": dict(entropy_coef=0.1),
    "sequence_level": dict(importance_sampling_level="sequence"),
    "no_bias_correction_kl": dict(use_bias_correction_kl=False),
    "everything": dict(delta=1.1, top_entropy_quantile=0.5, mask_truncated_completions=True,
                       off_policy_mask_threshold=0.01, entropy_coef=0.1),
}


# A combination the loss refuses (vespo forms its own sequence weight: token level only) is tested below
LOSS_OPTIONS = [(loss, option) for loss in TRL_LOSSES for option in sorted(OPTIONS)
                if not _refused(loss_type=loss, epsilon_high=_epsilon_high(loss), **OPTIONS[option])]


@pytest.mark.parametrize("loss_type, option", LOSS_OPTIONS)
def test_every_option_matches_trl(loss_type, option):
    kw = dict(OPTIONS[option])
    cfg = config(loss_type=loss_type, beta=0.04, epsilon_high=_epsilon_high(loss_type), **kw)
    case = make_case(1, truncate=cfg.mask_truncated_completions)
    if cfg.mask_truncated_completions:  # the case has a row cut at the limit, and it trains on nothing
        whole = make_case(1)
        assert trl_truncated(whole.completion_ids, whole.mask).tolist() == [True] + [False] * (B - 1)
        assert case.mask[0].sum() == 0 and torch.equal(case.mask[1:], whole.mask[1:])
    if cfg.off_policy_mask_threshold is not None:  # some negative-advantage rows dropped, not all
        keep = GRPOTrainer.get_off_policy_mask(case.advantages.unsqueeze(1), case.logps(), case.old, case.mask,
                                               cfg.off_policy_mask_threshold)
        negative = (case.advantages < 0) & (case.mask.sum(1) > 0)
        assert 0 < int((keep.squeeze(1) == 0).sum()) < int(negative.sum())
    metrics = compare(cfg, case)
    if cfg.entropy_coef:
        assert "policy_loss" in metrics


@pytest.mark.parametrize("loss_type", TRL_LOSSES)
def test_adaptive_entropy_coefficient_evolves_as_trl_s(loss_type):
    """Four updates of two micro-batches each: TRL's controller and ours see the same entropies; each micro-batch's
    loss and gradient, the coefficient after each update (clamped at both ends) and the gating by the last measured
    entropy agree. Logits scaled by 1 have a mean entropy above the target (1.5 nats), scaled by 3 below it."""
    cfg = config(loss_type=loss_type, beta=0.04, epsilon_high=_epsilon_high(loss_type), use_adaptive_entropy=True,
                 entropy_coef=0.04, entropy_coef_delta=0.03, entropy_coef_min=0.0, entropy_coef_max=0.05,
                 entropy_target=1.5)
    fake, control = _trl_trainer(cfg, accumulation=2), EntropyControl(cfg)
    coefficients, applied = [], []
    for update, scale in enumerate([3.0, 1.0, 1.0, 3.0]):
        cases = [make_case(10 + 2 * update + k, scale=scale) for k in range(2)]
        tokens = sum(int(c.mask.sum()) for c in cases)
        applied.append(control.applied())
        for k, case in enumerate(cases):
            fake.accelerator.sync_gradients = k == 1
            theirs, trl_metrics = trl_loss(fake, case, tokens)
            (grad_theirs,) = torch.autograd.grad(theirs, case.logits)
            ours, metrics = our_loss(cfg, case, control, normalizer=tokens, share=0.5)
            (grad_ours,) = torch.autograd.grad(ours, case.logits)
            if k == 1:
                control.end_update(lambda x: x)
            assert_same(ours, theirs, grad_ours, grad_theirs, metrics, trl_metrics, control)
        assert control.coef == pytest.approx(fake.entropy_coef, abs=TOL)
        assert control.last_entropy == pytest.approx(fake._last_world_entropy, abs=TOL)
        coefficients.append(control.coef)
    assert coefficients == pytest.approx([0.05, 0.02, 0.0, 0.03], abs=1e-12)  # up to the cap, down, to the floor, up
    # none before a measurement; then applied while the last entropy is at or below the target, else gated
    assert applied == pytest.approx([0.0, 0.05, 0.0, 0.0], abs=1e-12)


def test_entropy_mask_equals_trl_s_with_ties():
    """float32 entropies with repeated values (the quantile lands on a tie): the same tokens train."""
    from vlm_grpo.grpo.algorithm.losses.objective import ONE_PROCESS, high_entropy_mask

    fake = _trl_trainer(config())
    entropy = torch.tensor([[0.5, 1.0, 1.0, 2.0, 0.1], [1.0, 1.0, 3.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    for quantile in (0.2, 0.5, 0.6, 0.8, 1.0 - 1e-9):
        theirs = GRPOTrainer.get_high_entropy_mask(fake, entropy, mask, 1 - quantile)
        ours = high_entropy_mask(entropy, mask.float(), 1 - quantile, ONE_PROCESS)
        assert torch.equal(ours, theirs), quantile
    assert high_entropy_mask(entropy, mask.float(), 0.5, ONE_PROCESS).sum() == 6  # the median 1.0 (four ties) kept


def test_a_step_wide_normaliser_matches_trl():
    # A token count of the whole step (accumulation, processes) larger than the micro-batch's: dapo, cispo, vespo.
    for loss_type in ("dapo", "cispo", "vespo"):
        cfg = config(loss_type=loss_type, epsilon_high=_epsilon_high(loss_type))
        compare(cfg, make_case(3), normalizer=3 * sum(LENGTHS))


def test_defaults_match_trl_config():
    trl_defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    ours = LossConfig()
    shared = [f.name for f in dataclasses.fields(LossConfig) if f.name in trl_defaults]
    shared = [n for n in shared if n not in ("epsilon_high", "max_completion_length")]  # resolved / derived
    assert len(shared) == 25  # every TRL name the loss section takes, loss-specific ones and router_aux_loss_coef included
    for name in shared:
        assert getattr(ours, name) == trl_defaults[name], name
    assert trl_defaults["epsilon_high"] is None and ours.epsilon_high == ours.epsilon
    for name in ("scale_rewards", "multi_objective_aggregation"):
        from vlm_grpo.grpo.settings.sections import TrainConfig

        assert getattr(TrainConfig(), name) == trl_defaults[name], name


def test_sequence_level_with_token_sum_losses_warns_like_trl(caplog):
    # TRL 1.16 accepts importance_sampling_level="sequence" with these and only logs a warning (a log record, as TRL's)
    for loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        caplog.clear()
        LossConfig(loss_type=loss_type, importance_sampling_level="sequence", epsilon_high=5.0)
        assert "weights each sequence by its completion length" in caplog.text, loss_type
    caplog.clear()
    LossConfig(loss_type="grpo", importance_sampling_level="sequence")
    assert "weights each sequence" not in caplog.text


@pytest.mark.parametrize("loss_type, level", [("luspo", "token"), ("vespo", "sequence"), ("gmpo", "sequence")])
def test_a_loss_defined_at_one_level_refuses_the_other_naming_both(loss_type, level):
    # TRL warns for luspo at token level and vespo at sequence level; the issue asks for a refusal naming both.
    with pytest.raises(SettingError, match=rf"importance_sampling_level.*{level}.*loss_type '{loss_type}'"):
        LossConfig(loss_type=loss_type, importance_sampling_level=level)
    from vlm_grpo.grpo.settings.sources import load_config

    with pytest.raises(SettingError) as err:  # from the command line: the setting named once, with its section
        load_config(overrides=["--loss-type", loss_type, "--importance-sampling-level", level])
    assert str(err.value).startswith(f"setting 'loss.importance_sampling_level': '{level}' with loss_type")


def test_sync_ref_model_is_refused_where_trl_refuses_it():
    with pytest.raises(SettingError, match="sync_ref_model.*beta is 0"):
        LossConfig(sync_ref_model=True)
    from vlm_grpo.grpo.settings.sources import load_config

    with pytest.raises(SettingError, match="^setting 'loss.sync_ref_model': needs a reference"):
        load_config(overrides=["--sync-ref-model", "true", "--beta", "0"])

    with pytest.raises(SettingError, match="sync_ref_model.*LoRA"):
        load_config(overrides=["--sync-ref-model", "true", "--beta", "0.04", "--lora.r", "4"])
    assert load_config(overrides=["--sync-ref-model", "true", "--beta", "0.04"]).loss.sync_ref_model


def test_cispo_warns_when_its_cap_is_below_one():
    with pytest.warns(UserWarning, match="epsilon_high"):
        LossConfig(loss_type="cispo")


# ---------------------------------------------------------------- advantages (restated from TRL's code)


def trl_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int, scale_rewards: str,
                   aggregation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """grpo_trainer.py, `_generate_and_score_completions` (TRL 1.16): both multi_objective_aggregation branches."""
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
        if scale_rewards in ["group", "none"]:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = nanstd(rewards).expand_as(rewards)
        advantages = rewards - mean_grouped_rewards
        if scale_rewards != "none":
            advantages = advantages / (std_rewards + 1e-4)
    else:
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True)
        reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.shape[1])
        rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        std_rewards = nanstd(rewards).expand_as(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    return torch.nan_to_num(advantages, nan=0.0), is_std_zero


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_group_advantages_match_trl(scale_rewards):
    g = torch.Generator().manual_seed(4)
    n = 4
    rewards = torch.randn(5 * n, generator=g, dtype=torch.float64)
    rewards[n : 2 * n] = 1.0  # one flat group
    rewards[2 * n + 1] = float("nan")  # one unscorable completion
    ours, metrics = group_advantages(rewards, n, scale_rewards)
    ref, zero_std = trl_advantages(rewards.unsqueeze(1), torch.ones(1, dtype=torch.float64), n, scale_rewards,
                                   "sum_then_normalize")
    torch.testing.assert_close(ours, ref, atol=TOL, rtol=0)
    assert ours[2 * n + 1] == 0 and torch.all(ours[n : 2 * n] == 0)
    assert metrics["reward_mean"] == pytest.approx(torch.nanmean(rewards).item(), abs=TOL)
    assert metrics["reward_std"] == pytest.approx(nanstd(rewards).item(), abs=TOL)
    if scale_rewards != "batch":  # TRL's batch-mode flag is about the batch std; ours always counts groups
        assert metrics["frac_reward_zero_std"] == pytest.approx(zero_std.double().mean().item())
    assert metrics["frac_reward_zero_std"] == pytest.approx(1 / 5)


def test_normalize_then_sum_matches_trl():
    """GDPO: each reward normalised in its group, the weighted sum normalised over the batch, as TRL does; with
    rewards on very different scales, a missing component, a completion no reward applies to and a flat group."""
    g = torch.Generator().manual_seed(5)
    n = 4
    accuracy = (torch.rand(5 * n, generator=g) > 0.5).double()
    length = 300.0 * torch.rand(5 * n, generator=g, dtype=torch.float64)
    fmt = torch.randn(5 * n, generator=g, dtype=torch.float64)
    fmt[3] = float("nan")  # this reward does not apply to one completion
    accuracy[9] = length[9] = fmt[9] = float("nan")  # no reward applies to this one
    accuracy[12:16] = 1.0  # a flat component in one group
    components = {"accuracy": accuracy, "length": length, "format": fmt}
    weights = [1.0, 0.5, 2.0]
    scores = reward_scores(components, weights, n, "normalize_then_sum")
    cfg = SimpleNamespace(scale_rewards="group", multi_objective_aggregation="normalize_then_sum")
    ours, _ = GroupRelative().estimate(scores, torch.ones(5 * n, 3), cfg)
    stacked = torch.stack(list(components.values()), dim=1)
    ref, _ = trl_advantages(stacked, torch.tensor(weights, dtype=torch.float64), n, "group", "normalize_then_sum")
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref, atol=TOL, rtol=0)
    assert ours[9] == 0 and ours.abs().max() > 0.5
    # and the plain sum differs: the 300-scale reward would drown the others
    summed, _ = trl_advantages(stacked, torch.tensor(weights, dtype=torch.float64), n, "group", "sum_then_normalize")
    assert (summed - ref).abs().max() > 0.1


def test_on_policy_loss_values_by_hand():
    # On-policy with beta=0 the ratio is 1, so each token contributes -A: the aggregations differ only in their
    # denominators.
    lengths = torch.tensor(LENGTHS)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0, 7.0, -1.0], dtype=torch.float64)
    logps = torch.zeros(B, T, dtype=torch.float64, requires_grad=True)
    weighted = -(adv * lengths).sum()
    per_sequence = -(adv * (lengths > 0)).sum() / B  # the empty row contributes 0
    gate = torch.where(adv > 0, 2 / 1.0, 2 / 1.05).double()  # sapo: sigmoid(0) x 4 / tau, tau by the sign of A
    expected = {
        "grpo": per_sequence,
        "sapo": -(gate * adv * (lengths > 0)).sum() / B,
        "bnpo": weighted / lengths.sum(),
        "dr_grpo": weighted / (B * MAX_COMPLETION_LENGTH),
        "dapo": weighted / lengths.sum(),
        "luspo": weighted / B,
    }
    for loss_type, value in expected.items():
        loss, metrics = policy_loss(LossInputs(logps, adv, mask), config(loss_type=loss_type))
        tol = 1e-7 if loss_type == "sapo" else 1e-12  # TRL and ours hold sapo's temperatures as float32
        assert loss.item() == pytest.approx(value.item(), abs=tol), loss_type
        assert "kl" not in metrics
    loss, _ = policy_loss(LossInputs(logps, adv, mask, normalizer=100), config(loss_type="dapo"))
    assert loss.item() == pytest.approx(weighted.item() / 100, abs=1e-12)


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
        ({"top_entropy_quantile": 1.5}, "top_entropy_quantile"),
        ({"off_policy_mask_threshold": 0.0}, "off_policy_mask_threshold"),
        ({"entropy_coef_min": 0.5, "entropy_coef_max": 0.1}, "entropy_coef_min"),
        ({"ref_model_mixup_alpha": 1.5}, "ref_model_mixup_alpha"),
        ({"ref_model_sync_steps": 0}, "ref_model_sync_steps"),
        ({"sapo_temperature_pos": 0.0}, "sapo_temperature_pos"),
        ({"vespo_k_neg": -1.0}, "vespo_k_neg"),
        ({"gmpo_clip": 0.0}, "gmpo_clip"),
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
        policy_loss(LossInputs(x, adv, mask), LossConfig(beta=0.04))
    with pytest.raises(ValueError, match="completion_mask must have shape"):
        policy_loss(LossInputs(x, adv, torch.ones(2, 4)), LossConfig())
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(LossInputs(x, torch.zeros(3), mask), LossConfig())
    with pytest.raises(ValueError, match="normalizer"):
        policy_loss(LossInputs(x, adv, mask, normalizer=-1), LossConfig())
    with pytest.raises(ValueError, match="entropy is required"):
        policy_loss(LossInputs(x, adv, mask), LossConfig(entropy_coef=0.1))


def test_normalizer_is_step_tokens_only_and_clamped():
    logps = torch.zeros(2, 3, requires_grad=True)
    adv, mask = torch.tensor([1.0, -3.0]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    for loss_type in ("grpo", "dr_grpo", "bnpo", "sapo", "luspo"):
        cfg = config(loss_type=loss_type)
        plain, _ = policy_loss(LossInputs(logps, adv, mask), cfg)
        given, _ = policy_loss(LossInputs(logps, adv, mask, normalizer=torch.tensor(50.0)), cfg)
        assert given.item() == plain.item(), loss_type
    # An all-empty batch: a zero token count is clamped to 1 (TRL: num_items_in_batch.clamp(min=1.0)), not 0/0.
    for normalizer in (None, 0, torch.tensor(0.0)):
        loss, _ = policy_loss(LossInputs(logps, adv, torch.zeros(2, 3), normalizer=normalizer), LossConfig())
        assert loss.item() == 0.0
    loss, _ = policy_loss(LossInputs(logps, adv, mask, normalizer=torch.tensor(0.5)), LossConfig())
    assert loss.item() == pytest.approx(1.0)  # -(2*1 + 1*(-3)) / max(0.5, 1)
    assert not math.isnan(loss.item())
