"""luspo: GSPO's sequence-level clipped ratio, each sequence's loss scaled by its length (sum, not mean)."""

from __future__ import annotations

from vlm_grpo.grpo.algorithm.losses.base import register, require_level
from vlm_grpo.grpo.algorithm.losses.clipped import ClippedSurrogate


@register
class LUSPO(ClippedSurrogate):
    name = "luspo"
    trl_loss_type = "luspo"
    summary = "sequence-level clipped ratio x advantage; each sequence's token sum, mean over sequences"
    paper = "LUSPO, arXiv:2602.05261"
    normalisation = "sequence_sum"

    @classmethod
    def check(cls, cfg) -> None:
        require_level(cls.name, "sequence", cfg)
