"""Truncated importance sampling for an engine that samples with other numerics than the trainer (vLLM).

The loss is built on the trainer's recomputed log-probs; the completions were drawn by the engine, whose own
log-probs differ (other kernels, other precision, weights one push behind). Each token's loss is weighed by the
ratio p_trainer / p_engine, bounded as TRL 1.16 bounds it (`vllm_importance_sampling_mode`):

- token_truncate: per-token ratios clipped to [clip_min, clip_max];
- token_mask: per-token ratios outside [clip_min, clip_max] set to 0;
- sequence_truncate / sequence_mask: one ratio per completion, exp of the summed log-ratio over its training
  tokens, clipped or zeroed likewise.

Tokens the engine gave no log-prob for (NaN) get ratio 1. The statistics TRL logs (`sampling/...`) come with it,
and the share of ratios the bounds clipped or masked. An asynchronous worker's log-probs (rollout.max_staleness)
are weighed the same way: its weights are up to K steps behind the trainer's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class SamplingCorrection:
    ratio: torch.Tensor  # [N, T] (token modes) or [N, 1] (sequence modes): multiplies the per-token loss
    metrics: dict[str, float]  # TRL's
    clipped_share: float = 0.0  # the share of the ratios (tokens, or sequences) its bounds clipped or masked


def correction_ratio(trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                     clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """The bounded importance ratio of trainer to engine probabilities over the training tokens (`mask`)."""
    diff = torch.nan_to_num((trainer_logps - engine_logps) * mask, nan=0.0)
    sequence = mode.startswith("sequence_")
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if sequence else diff)
    if mode.endswith("_truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode.endswith("_mask"):
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(f"unknown vllm_importance_sampling_mode {mode!r}; one of token_truncate, token_mask, "
                     "sequence_truncate, sequence_mask")


def sampling_correction(trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                        clip_min: float | None, clip_max: float | None) -> SamplingCorrection:
    """The ratio, the statistics TRL logs (the ratio's min / mean / max over training tokens, or sequences, and the
    engine-vs-trainer log-prob gap, mean and max over the training tokens the engine scored), and the share of
    ratios outside the bounds."""
    mask = mask.to(trainer_logps.dtype)
    ratio = correction_ratio(trainer_logps, engine_logps, mask, mode, clip_min, clip_max)
    flat = ratio.flatten() if mode.startswith("sequence_") else ratio[mask.bool()]
    raw = correction_ratio(trainer_logps, engine_logps, mask, mode, None, None)  # before its bounds
    raw = raw.flatten() if mode.startswith("sequence_") else raw[mask.bool()]
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    outside = ((raw < low) | (raw > high)).to(trainer_logps.dtype)
    gap = (trainer_logps - engine_logps).abs()
    gap = gap[mask.bool() & ~torch.isnan(gap)]

    def stat(x: torch.Tensor, fn) -> float:
        return float(fn(x)) if x.numel() else 0.0

    metrics = {
        "sampling/importance_sampling_ratio/min": stat(flat, torch.min),
        "sampling/importance_sampling_ratio/mean": stat(flat, torch.mean),
        "sampling/importance_sampling_ratio/max": stat(flat, torch.max),
        "sampling/sampling_logp_difference/mean": stat(gap, torch.mean),
        "sampling/sampling_logp_difference/max": stat(gap, torch.max),
    }
    return SamplingCorrection(ratio=ratio, metrics=metrics, clipped_share=stat(outside, torch.mean))


def weigh_by_engine(traj, engine_logps: torch.Tensor, rollout) -> dict[str, float]:
    """Set the trajectory's engine log-probs and the ratio its loss is weighed by (from the trainer's freshly
    recomputed `old_logps`, under the `rollout` settings' mode and bounds); the statistics to log."""
    traj.sampling_logps = engine_logps
    correction = sampling_correction(traj.old_logps, engine_logps, traj.loss_mask, rollout.vllm_importance_sampling_mode,
                                     rollout.vllm_importance_sampling_clip_min, rollout.vllm_importance_sampling_clip_max)
    traj.sampling_ratio = correction.ratio
    return {**correction.metrics, "sampling/importance_sampling_ratio/clipped_share": correction.clipped_share}


class CorrectionTally:
    """The ratio computed per micro-batch from the update's own log-probs (detached), where they are the old ones
    (one update of a batch sampled elsewhere: an asynchronous worker's), instead of a forward of its own; the
    statistics over all micro-batches as `weigh_by_engine` gives them over the whole batch."""

    def __init__(self, rollout):
        self.rollout = rollout
        self.ratios: list[torch.Tensor] = []
        self.gaps: list[torch.Tensor] = []
        self.outside: list[torch.Tensor] = []

    def ratio(self, trainer_logps: torch.Tensor, engine_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        r = self.rollout
        mode, low, high = r.vllm_importance_sampling_mode, r.vllm_importance_sampling_clip_min, \
            r.vllm_importance_sampling_clip_max
        trainer_logps = trainer_logps.detach()
        mask = mask.to(trainer_logps.dtype)
        ratio = correction_ratio(trainer_logps, engine_logps, mask, mode, low, high)
        raw = correction_ratio(trainer_logps, engine_logps, mask, mode, None, None)
        sequence = mode.startswith("sequence_")
        keep = slice(None) if sequence else mask.bool()
        self.ratios.append((ratio.flatten() if sequence else ratio[keep]).float())
        raw = raw.flatten() if sequence else raw[keep]
        self.outside.append(((raw < (-math.inf if low is None else low)) | (raw > (math.inf if high is None else high))
                             ).float())
        gap = (trainer_logps - engine_logps).abs()
        self.gaps.append(gap[mask.bool() & ~torch.isnan(gap)].float())
        return ratio

    def metrics(self) -> dict[str, float]:
        def stat(parts: list[torch.Tensor], fn) -> float:
            x = torch.cat(parts) if parts else torch.zeros(0)
            return float(fn(x)) if x.numel() else 0.0

        return {
            "sampling/importance_sampling_ratio/min": stat(self.ratios, torch.min),
            "sampling/importance_sampling_ratio/mean": stat(self.ratios, torch.mean),
            "sampling/importance_sampling_ratio/max": stat(self.ratios, torch.max),
            "sampling/sampling_logp_difference/mean": stat(self.gaps, torch.mean),
            "sampling/sampling_logp_difference/max": stat(self.gaps, torch.max),
            "sampling/importance_sampling_ratio/clipped_share": stat(self.outside, torch.mean),
        }
