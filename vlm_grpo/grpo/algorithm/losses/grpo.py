"""grpo: the clipped surrogate, each sequence's token mean, then the mean over sequences (DeepSeekMath)."""

from __future__ import annotations

from vlm_grpo.grpo.algorithm.losses.base import register
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate


@register
class GRPO(ClippedSurrogate):
    name = "grpo"
    trl_loss_type = "grpo"
    summary = "clipped ratio x advantage; mean over each sequence's tokens, then over sequences (length-biased)"
    paper = "DeepSeekMath, arXiv:2402.03300"
    normalisation = "sequence"
