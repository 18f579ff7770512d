"""dr_grpo: the clipped surrogate over a constant (rows x max completion length): no length bias."""

from __future__ import annotations

from vlm_grpo.grpo.algorithm.losses.base import register
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate


@register
class DrGRPO(ClippedSurrogate):
    name = "dr_grpo"
    trl_loss_type = "dr_grpo"
    summary = "clipped ratio x advantage; sum / (rows x max_completion_length), a constant"
    paper = "Dr. GRPO, arXiv:2503.20783"
    normalisation = "max_length"
    sums_sequence_ratio = True  # with a sequence-level ratio, long sequences weigh more (TRL warns)
