"""bnpo: the clipped surrogate normalised by the tokens of the micro-batch (batch-normalised)."""

from __future__ import annotations

from vlm_grpo.grpo.algorithm.losses.base import register
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate


@register
class BNPO(ClippedSurrogate):
    name = "bnpo"
    trl_loss_type = "bnpo"
    summary = "clipped ratio x advantage; sum / completion tokens of the micro-batch (local)"
    paper = "BNPO, arXiv:2506.02864"
    normalisation = "tokens"
    sums_sequence_ratio = True  # with a sequence-level ratio, long sequences weigh more (TRL warns)
