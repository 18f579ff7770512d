"""gmpo: the geometric mean of the token ratios, each clipped in log space, times the sequence's advantage.

GMPO maximises A x exp(mean_t clip(log r_t)) per sequence instead of the arithmetic mean of r_t A: one outlier
token moves the geometric mean far less. Clipping is one-sided by the advantage's sign (sgn(A) min(sgn(A) log r,
sgn(A) clip(log r, -gmpo_clip, gmpo_clip))), as in verl's geo_mean policy loss.
"""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.losses.base import LossTerms, PolicyLoss, register, require_level


@register
class GMPO(PolicyLoss):
    name = "gmpo"
    summary = "-A x exp(token mean of sign-clipped log ratios) (a geometric-mean ratio); mean over sequences"
    paper = "GMPO, arXiv:2507.20673"
    normalisation = "sequence"
    settings = ("gmpo_clip",)

    @classmethod
    def check(cls, cfg) -> None:
        require_level(cls.name, "token", cfg)  # it forms its own sequence ratio from the token ratios

    def per_token(self, terms: LossTerms, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask, log_ratio = terms.mask, terms.log_ratio
        tokens = mask.sum(-1, keepdim=True).clamp(min=1.0)  # an empty row: advantage 0 (exact means otherwise)
        advantage = (terms.advantages * mask).sum(-1, keepdim=True) / tokens  # the sequence's advantage
        sign = torch.sign(advantage)
        clipped = torch.clamp(log_ratio, -cfg.gmpo_clip, cfg.gmpo_clip)
        kept = sign * torch.min(sign * log_ratio, sign * clipped)
        ratio = torch.exp((kept * mask).sum(-1, keepdim=True) / tokens)  # [R, 1]
        was_clipped = ((kept != log_ratio) & (sign != 0) & mask.bool()).float()
        return -advantage * ratio, {"gmpo/clip_fraction": was_clipped}
