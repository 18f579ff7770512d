"""vespo: a smooth, asymmetric Gamma weight of the sequence's importance ratio scales -A x log-prob (VESPO).

phi(w) = exp(lambda + k log w - lambda w) (so phi(1) = 1), with w the sequence's product of token ratios, k and
lambda chosen by the advantage's sign; phi carries no gradient. Clamps as TRL 1.16 (log ratios to [-20, 20],
log w to [log 1e-8, 20]).
"""

from __future__ import annotations

import math

import torch

from vlm_grpo.grpo.algorithm.losses.base import LossTerms, PolicyLoss, register, require_level

LOG_W_MIN = math.log(1e-8)


@register
class VESPO(PolicyLoss):
    name = "vespo"
    trl_loss_type = "vespo"
    summary = "-phi(w) x advantage x log-prob, phi a Gamma weight of the sequence ratio w; sum / tokens of the step"
    paper = "VESPO, arXiv:2602.10693"
    normalisation = "step_tokens"
    settings = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")

    @classmethod
    def check(cls, cfg) -> None:
        require_level(cls.name, "token", cfg)  # it forms its own sequence weight from the token ratios

    def per_token(self, terms: LossTerms, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with torch.no_grad():
            log_ratio = torch.clamp(terms.log_ratio, -20.0, 20.0)
            log_w = torch.clamp((log_ratio * terms.mask).sum(-1, keepdim=True), LOG_W_MIN, 20.0)  # [R, 1]
            positive = terms.advantages >= 0
            k = torch.where(positive, cfg.vespo_k_pos, cfg.vespo_k_neg)
            lam = torch.where(positive, cfg.vespo_lambda_pos, cfg.vespo_lambda_neg).clamp(min=1e-4)
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        return -phi * terms.advantages * terms.logps, {"vespo/phi_seq_mean": phi}
