"""The policy objective every loss shares, in TRL 1.16's order (`GRPOTrainer._compute_loss`):

1. the high-entropy token mask (`top_entropy_quantile` < 1: only the top quantile of tokens by entropy train);
2. the off-policy sequence mask (`off_policy_mask_threshold`: a negative-advantage sequence whose mean KL from the
   sampling policy exceeds the threshold is dropped; DeepSeek-V3.2);
3. the importance ratio, per token or per sequence (`importance_sampling_level`, GSPO);
4. the k3 KL to the reference, times the ratio under `use_bias_correction_kl`;
5. the registered loss's per-token term, masked, plus beta x KL;
   (with an engine's sampling correction, rollout/vllm/engine.py: the per-token loss times its bounded ratio of
   trainer to engine probabilities, algorithm/sampling_correction.py);
6. the loss's normalisation (`NORMALISATIONS`); micro-batch normalisations are scaled by the micro-batch's share of
   the step's rows (TRL divides them by the accumulation steps), `step_tokens` by the step's token count;
7. the entropy bonus: minus `entropy_coef` x the mean entropy of the training tokens (scaled by the share).

A run builds its `PolicyObjective` once (the loss object with it) and passes each micro-batch's tensors as one
`LossInputs`. On-policy (`old_logps=None`) the old log-probs are `logps.detach()`: the ratio is 1 in value but
carries gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from vlm_grpo.grpo.algorithm.losses.base import LOSSES, LossTerms, MetricStats


def _local(x: torch.Tensor) -> torch.Tensor:
    return x


class Collective:
    """How statistics cross processes: `reduce_sum` (a tensor summed over processes) and `gather` (1-D tensors of any
    length concatenated). The default is one process."""

    def __init__(self, reduce_sum: Callable = _local, gather: Callable = _local):
        self.reduce_sum, self.gather = reduce_sum, gather


ONE_PROCESS = Collective()


def _check_shape(name: str, x: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if x is not None and tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} like logps, got {tuple(x.shape)}.")


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float, collective: Collective) -> torch.Tensor:
    """Tokens whose entropy is at or above the `quantile` of every process's training tokens (TRL's rule)."""
    gathered = collective.gather(entropy[mask.bool()].float())
    if gathered.numel() == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    threshold = torch.quantile(gathered, quantile)
    return ((entropy * mask) >= threshold) & mask.bool()


def off_policy_mask(advantages, logps, sampling_logps, mask, threshold: float) -> torch.Tensor:
    """[R, 1]: 1 keeps a sequence; a negative-advantage sequence whose mean KL(sampling || policy) > threshold is 0."""
    kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    mean_kl = (kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (mean_kl <= threshold)).to(mask.dtype)


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, normalisation: str, cfg, normalizer) -> torch.Tensor:
    masked = per_token * mask  # broadcasts a [R, 1] sequence-level loss over the tokens
    if normalisation == "sequence":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if normalisation == "tokens":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if normalisation == "max_length":
        return masked.sum() / (per_token.size(0) * cfg.max_completion_length)
    if normalisation == "sequence_sum":
        return masked.sum(-1).mean()
    if normalizer is None:  # step_tokens without a step count: this micro-batch is the step
        denom = mask.sum().clamp(min=1.0)
    elif isinstance(normalizer, torch.Tensor):
        denom = normalizer.to(masked.dtype).clamp(min=1.0)  # TRL clamps num_items_in_batch the same way
    else:
        denom = max(float(normalizer), 1.0)
    return masked.sum() / denom


@dataclass
class LossInputs:
    """One micro-batch's tensors for the objective: R completion rows, T tokens wide."""

    logps: torch.Tensor  # [R, T] the policy's log-probs of the sampled tokens (with gradient)
    advantages: torch.Tensor  # [R] or [R, T]
    mask: torch.Tensor  # [R, T] 1 on the tokens that train
    old_logps: torch.Tensor | None = None  # [R, T] the sampling policy's (None: on-policy)
    ref_logps: torch.Tensor | None = None  # [R, T] the reference's (None: no reference; needed when beta != 0)
    # [R, T]: needed for the entropy mask and bonus; with a bonus it carries the policy's gradient, as TRL's does,
    # so the bonus raises the entropy
    entropy: torch.Tensor | None = None
    sampling_logps: torch.Tensor | None = None  # [R, T] the sampling engine's own (vLLM's: the off-policy mask's)
    sampling_ratio: torch.Tensor | None = None  # [R, T] or [R, 1] the engine correction multiplying the loss
    normalizer: float | torch.Tensor | None = None  # the step's completion tokens per process (None: this batch's)
    share: float = 1.0  # this micro-batch's fraction of the step's rows


def _checked_advantages(x: LossInputs, cfg) -> torch.Tensor:
    """Refuse tensors whose shapes do not fit logps; the advantages as [R, 1] or [R, T]."""
    logps, advantages, normalizer = x.logps, x.advantages, x.normalizer
    if logps.dim() != 2:
        raise ValueError(f"logps must be [R, T] per-token log-probs, got shape {tuple(logps.shape)}.")
    shape = tuple(logps.shape)
    for name, t in (("old_logps", x.old_logps), ("ref_logps", x.ref_logps), ("completion_mask", x.mask),
                    ("entropy", x.entropy)):
        _check_shape(name, t, shape)
    if cfg.beta != 0.0 and x.ref_logps is None:
        raise ValueError(f"ref_logps is required when beta != 0 (beta={cfg.beta}).")
    if isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool) and normalizer < 0:
        raise ValueError(f"normalizer (completion-token count) must be non-negative, got {normalizer!r}.")
    if advantages.dim() == 1:
        if advantages.shape[0] != shape[0]:
            raise ValueError(f"advantages must have shape ({shape[0]},), got {tuple(advantages.shape)}.")
        return advantages.unsqueeze(1)
    if tuple(advantages.shape) != shape:
        raise ValueError(f"advantages must be [R] or [R, T] = {shape}, got {tuple(advantages.shape)}.")
    return advantages


class PolicyObjective:
    """The run's policy objective: the loss named by `cfg.loss_type`, built once, applied to each micro-batch.

    entropy_control: the bonus's coefficient (an EntropyControl, which also records each micro-batch's entropy;
    None: `cfg.entropy_coef`). collective: how its statistics cross processes.
    """

    def __init__(self, cfg, *, entropy_control=None, collective: Collective = ONE_PROCESS):
        self.cfg, self.entropy_control, self.collective = cfg, entropy_control, collective
        self.loss = LOSSES[cfg.loss_type]()
        self.normalisation = type(self.loss).normalisation

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss of one micro-batch, and its metrics (plain floats, averaged over processes)."""
        cfg, collective, entropy_control = self.cfg, self.collective, self.entropy_control
        logps, old_logps, ref_logps, entropy = x.logps, x.old_logps, x.ref_logps, x.entropy
        mask, normalizer, share = x.mask, x.normalizer, x.share
        advantages = _checked_advantages(x, cfg)
        coef = cfg.entropy_coef if entropy_control is None else entropy_control.applied()
        bonus = coef != 0.0 or cfg.use_adaptive_entropy
        if entropy is None and (cfg.top_entropy_quantile < 1.0 or bonus):
            raise ValueError("entropy is required with top_entropy_quantile < 1 or an entropy bonus")

        mask = mask.to(logps.dtype)
        advantages = advantages.to(logps.dtype)
        old_logps = logps.detach() if old_logps is None else old_logps
        entropy_mask = None
        if cfg.top_entropy_quantile < 1.0:
            entropy_mask = high_entropy_mask(entropy, mask, 1 - cfg.top_entropy_quantile, collective)
        keep = None
        if cfg.off_policy_mask_threshold is not None:
            sampled = old_logps if x.sampling_logps is None else x.sampling_logps
            keep = off_policy_mask(advantages, logps, sampled, mask, cfg.off_policy_mask_threshold)

        log_ratio = logps - old_logps
        if cfg.importance_sampling_level == "token":
            log_weights = log_ratio
        else:
            log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        ratio = torch.exp(log_weights)  # [R, T] or [R, 1]

        per_token_kl = None
        if cfg.beta != 0.0:
            ref_minus_pol = ref_logps - logps
            per_token_kl = torch.exp(ref_minus_pol) - ref_minus_pol - 1  # k3 estimator
            if cfg.use_bias_correction_kl:
                per_token_kl = per_token_kl * ratio

        terms = LossTerms(logps=logps, old_logps=old_logps, log_ratio=log_ratio, ratio=ratio, advantages=advantages,
                          mask=mask)
        per_token, metric_tensors = self.loss.per_token(terms, cfg)
        if keep is not None:
            per_token = per_token * keep
        if entropy_mask is not None:
            per_token = per_token * entropy_mask
        if x.sampling_ratio is not None:
            per_token = per_token * x.sampling_ratio.to(per_token.dtype)
        if per_token_kl is not None:
            per_token = per_token + cfg.beta * per_token_kl
        policy = _aggregate(per_token, mask, self.normalisation, cfg, normalizer)
        # micro-batch normalisations are a share of the step's loss; step_tokens already divides by the whole step
        loss = policy if self.normalisation == "step_tokens" else policy * share
        unscaled = policy

        stats = MetricStats(mask, collective.reduce_sum, collective.gather)
        metrics = self.loss.metrics(metric_tensors, stats)
        if bonus:
            effective = mask if entropy_mask is None else mask * entropy_mask
            mean_entropy = (entropy * effective).sum() / effective.sum().clamp(min=1.0)
            loss = loss - coef * mean_entropy * share
            unscaled = policy - coef * mean_entropy
            metrics["policy_loss"] = policy.item()  # (the coefficient is logged by whoever steps it: the trainer)
            if entropy_control is not None:
                entropy_control.observe(entropy, effective)
        if per_token_kl is not None:
            metrics["kl"] = stats.mean(per_token_kl)
        if entropy is not None:
            metrics["entropy"] = stats.mean(entropy)
        metrics["loss"] = unscaled.item()  # this micro-batch's loss before its share of the step is taken
        return loss, metrics


def policy_loss(inputs: LossInputs, cfg, *, entropy_control=None,
                collective: Collective = ONE_PROCESS) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's loss and metrics with an objective built for it alone (a run builds its objective once)."""
    return PolicyObjective(cfg, entropy_control=entropy_control, collective=collective)(inputs)
