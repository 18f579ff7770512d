"""dapo (the default, as in TRL): the clipped surrogate over the completion tokens of the whole step."""

from __future__ import annotations

from vlm_grpo.grpo.algorithm.losses.base import register
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate


@register
class DAPO(ClippedSurrogate):
    name = "dapo"
    trl_loss_type = "dapo"
    summary = "clipped ratio x advantage; sum / completion tokens of the whole step (all micro-batches, processes)"
    paper = "DAPO, arXiv:2503.14476"
    normalisation = "step_tokens"
    sums_sequence_ratio = True  # with a sequence-level ratio, long sequences weigh more (TRL warns)
