"""sapo: a smooth, temperature-controlled gate on the ratio instead of hard clipping (Soft Adaptive PO)."""

from __future__ import annotations

import torch

from vlm_grpo.grpo.algorithm.losses.base import LossTerms, PolicyLoss, register


@register
class SAPO(PolicyLoss):
    name = "sapo"
    trl_loss_type = "sapo"
    summary = "-sigmoid(tau (ratio - 1)) 4 / tau x advantage (tau by the advantage's sign); sequence means"
    paper = "SAPO, arXiv:2511.20347"
    normalisation = "sequence"
    settings = ("sapo_temperature_neg", "sapo_temperature_pos")

    def per_token(self, terms: LossTerms, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tau = torch.where(terms.advantages > 0, cfg.sapo_temperature_pos, cfg.sapo_temperature_neg)
        gate = torch.sigmoid(tau * (terms.ratio - 1)) * 4 / tau
        return -gate * terms.advantages, {}
