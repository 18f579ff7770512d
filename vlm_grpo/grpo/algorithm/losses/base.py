"""The GRPO policy loss on per-token log-probs, with TRL 1.16's exact arithmetic.

Per token (or per sequence, `importance_sampling_level="sequence"`, GSPO):

    ratio  = exp(logp - old_logp)                       token level, [B, T]
           = exp(sum_t m*(logp - old_logp) / max(1, sum_t m))   sequence level, [B, 1]
    loss_t = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
           + beta * k3(ref || policy) * (ratio if use_bias_correction_kl)

with k3 = exp(ref - logp) - (ref - logp) - 1. Nothing is detached inside the sequence ratio (TRL 1.16
has no GSPO-token stop-gradient variant); on-policy (`old_logps=None`) the old log-probs are
`logps.detach()`, so the ratio is 1 in value but still carries the gradient.

Aggregation, with m the completion mask (a [B, 1] sequence-level loss is broadcast over m):

- `grpo`:    mean over sequences of (sum_t m*loss / max(1, sum_t m))
- `dr_grpo`: sum(m*loss) / (B * max_completion_length)
- `dapo`:    sum(m*loss) / max(1, normalizer), normalizer = the global completion-token count when
             given (across processes / accumulation), else the local sum(m). Ignored by grpo/dr_grpo.

Gradient-accumulation scaling of `grpo`/`dr_grpo` (TRL divides them by the accumulation steps) is
the caller's job; for `dapo` it is folded into `normalizer`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from vlm_grpo.grpo.settings.fields import SettingError, check_fields, setting

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass
class LossConfig:
    """GRPO loss settings. Defaults are TRL 1.16's `GRPOConfig` defaults, except `max_completion_length`.

    `epsilon_high=None` resolves to `epsilon`. `delta` (INTELLECT-2 two-sided clipping: the unclipped
    ratio is capped at `delta`) and `use_bias_correction_kl` (multiply the KL term by the importance
    ratio; TRL's default True) mirror the TRL options of the same names.
    """

    loss_type: str = setting("dapo", help="aggregation: grpo (mean per sequence), dr_grpo (sum / (rows x max length)), "
                             "dapo (sum / completion tokens of the step)", choices=LOSS_TYPES)
    epsilon: float = setting(0.2, help="clip range: the ratio is clipped below at 1 - epsilon", at_least=0.0, below=1.0)
    epsilon_high: float | None = setting(None, help="clip range above, 1 + epsilon_high (None: epsilon)", at_least=0.0)
    beta: float = setting(0.0, help="KL coefficient (k3 estimator against the reference policy; 0: no reference)",
                          at_least=0.0)
    importance_sampling_level: str = setting("token", help="importance ratio per token, or per sequence (GSPO)",
                                             choices=IMPORTANCE_SAMPLING_LEVELS)
    max_completion_length: int = setting(64, help="dr_grpo's normaliser; a run sets it from generation.max_new_tokens",
                                         at_least=1)
    use_bias_correction_kl: bool = setting(True, help="multiply the KL term by the importance ratio (TRL's default)")
    delta: float | None = setting(None, help="cap of the unclipped ratio (two-sided clipping; None: off)", above=1.0)
    router_aux_loss_coef: float | None = setting(
        None, help="mixture-of-experts models: weight of the routers' load-balancing loss added to the loss, as TRL "
        "(None: the model config's router_aux_loss_coef; 0: off; an error on a model without routers)", at_least=0.0)

    def __post_init__(self):
        check_fields(self)
        if not isinstance(self.max_completion_length, int) or isinstance(self.max_completion_length, bool):
            raise SettingError("max_completion_length", f"{self.max_completion_length!r} is not an int")
        if not isinstance(self.use_bias_correction_kl, bool):
            raise SettingError("use_bias_correction_kl", f"{self.use_bias_correction_kl!r} is not a bool")
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.importance_sampling_level == "sequence" and self.loss_type in ("dr_grpo", "dapo"):
            # TRL 1.16 allows this combination and only warns; so do we.
            warnings.warn(
                f"With importance_sampling_level='sequence', the {self.loss_type!r} loss sums per-token "
                "contributions, which weights each sequence by its completion length instead of optimizing the "
                "per-sequence objective. The GSPO paper's setup is loss_type='grpo'.",
                stacklevel=3,
            )

    @property
    def epsilon_low(self) -> float:
        return self.epsilon


def _check_shape(name: str, x: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if x is not None and tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} like logps, got {tuple(x.shape)}.")


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    cfg: LossConfig,
    normalizer: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Scalar GRPO loss and detached metrics.

    logps / old_logps / ref_logps: per-token log-probs [B, T] of the completion tokens under the policy
    (with grad), the sampling policy (None: on-policy, `logps.detach()`) and the reference model (needed
    only when `cfg.beta > 0`). advantages: [B] (or [B, T]). completion_mask: [B, T], 1 on completion tokens.
    normalizer: `dapo` only (ignored by grpo/dr_grpo), the completion-token count the loss sum is divided
    by, clamped to >= 1 as TRL does; None uses the local mask sum.

    Metrics: `clip_ratio/low_mean`, `clip_ratio/high_mean`, `clip_ratio/region_mean` (masked means of
    "the clip bound is the active term": ratio < 1-eps_low with A < 0, ratio > 1+eps_high with A > 0, either;
    at sequence level, means over sequences), `clip_ratio/low_min`, `clip_ratio/high_max` (extremes of the
    per-sequence rates, empty sequences ignored), and `kl` (masked mean of the beta-weighted term before
    beta, i.e. k3 times the ratio under bias correction) when beta > 0.
    """
    if logps.dim() != 2:
        raise ValueError(f"logps must be [B, T] per-token log-probs, got shape {tuple(logps.shape)}.")
    shape = tuple(logps.shape)
    _check_shape("old_logps", old_logps, shape)
    _check_shape("ref_logps", ref_logps, shape)
    _check_shape("completion_mask", completion_mask, shape)
    if cfg.beta != 0.0 and ref_logps is None:
        raise ValueError(f"ref_logps is required when beta != 0 (beta={cfg.beta}).")
    if advantages.dim() == 1:
        if advantages.shape[0] != shape[0]:
            raise ValueError(f"advantages must have shape ({shape[0]},), got {tuple(advantages.shape)}.")
        advantages = advantages.unsqueeze(1)
    elif tuple(advantages.shape) != shape:
        raise ValueError(f"advantages must be [B] or [B, T] = {shape}, got {tuple(advantages.shape)}.")
    if isinstance(normalizer, (int, float)) and not isinstance(normalizer, bool) and normalizer < 0:
        raise ValueError(f"normalizer (completion-token count) must be non-negative, got {normalizer!r}.")

    mask = completion_mask.to(logps.dtype)
    advantages = advantages.to(logps.dtype)
    if old_logps is None:
        old_logps = logps.detach()

    log_ratio = logps - old_logps
    if cfg.importance_sampling_level == "token":
        log_weights = log_ratio
    else:
        log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_weights)  # [B, T] or [B, 1]

    per_token_kl = None
    if cfg.beta != 0.0:
        ref_minus_pol = ref_logps - logps
        per_token_kl = torch.exp(ref_minus_pol) - ref_minus_pol - 1  # k3 estimator
        if cfg.use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio

    clipped = torch.clamp(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    if cfg.delta is not None:
        ratio = torch.clamp(ratio, max=cfg.delta)
    per_token_loss = -torch.min(ratio * advantages, clipped * advantages)
    if per_token_kl is not None:
        per_token_loss = per_token_loss + cfg.beta * per_token_kl

    masked = per_token_loss * mask  # broadcasts a [B, 1] sequence-level loss over the tokens
    if cfg.loss_type == "grpo":
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif cfg.loss_type == "dr_grpo":
        loss = masked.sum() / (per_token_loss.size(0) * cfg.max_completion_length)
    else:  # dapo
        if normalizer is None:
            denom = mask.sum().clamp(min=1.0)
        elif isinstance(normalizer, torch.Tensor):
            denom = normalizer.to(masked.dtype).clamp(min=1.0)  # TRL clamps num_items_in_batch the same way
        else:
            denom = max(float(normalizer), 1.0)
        loss = masked.sum() / denom

    metrics = _metrics(ratio.detach(), advantages.detach(), mask, per_token_kl, cfg)
    return loss, metrics


@torch.no_grad()
def _metrics(ratio, advantages, mask, per_token_kl, cfg: LossConfig) -> dict[str, float]:
    def masked_mean(x: torch.Tensor) -> float:
        if x.shape[1] == 1:  # sequence level: one value per sequence, plain mean over sequences
            return (x.sum() / x.shape[0]).item()
        return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()

    def per_sequence(x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            return x.squeeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)  # NaN for an empty sequence, ignored below

    def extreme(x: torch.Tensor, fn) -> float:
        x = x[~torch.isnan(x)]
        return fn(x).item() if x.numel() else float("nan")

    low = ((ratio < 1 - cfg.epsilon_low) & (advantages < 0)).float()
    high = ((ratio > 1 + cfg.epsilon_high) & (advantages > 0)).float()
    region = torch.maximum(low, high)
    metrics = {
        "clip_ratio/low_mean": masked_mean(low),
        "clip_ratio/high_mean": masked_mean(high),
        "clip_ratio/region_mean": masked_mean(region),
        "clip_ratio/low_min": extreme(per_sequence(low), torch.min),
        "clip_ratio/high_max": extreme(per_sequence(high), torch.max),
    }
    if per_token_kl is not None:
        metrics["kl"] = masked_mean(per_token_kl.detach())
    return metrics
