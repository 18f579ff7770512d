"""cispo: the importance weight itself is clipped (and detached), so every token keeps a gradient (MiniMax-M1)."""

from __future__ import annotations

import warnings

import torch

from vlm_grpo.grpo.algorithm.losses.base import LossTerms, PolicyLoss, register


@register
class CISPO(PolicyLoss):
    name = "cispo"
    trl_loss_type = "cispo"
    summary = "-min(ratio, epsilon_high).detach() x advantage x log-prob; sum / tokens of the step"
    paper = "MiniMax-M1, arXiv:2506.13585 (ScaleRL: epsilon_high 5.0)"
    normalisation = "step_tokens"
    sums_sequence_ratio = True  # with a sequence-level ratio, long sequences weigh more (TRL warns)

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.epsilon_high < 1.0:  # TRL's default resolves to epsilon: every ratio would be capped below 1
            warnings.warn(f"cispo caps the importance ratio at epsilon_high, which is {cfg.epsilon_high}: every token's "
                          "weight is below 1 (ScaleRL uses epsilon_high 5.0)", stacklevel=3)

    def per_token(self, terms: LossTerms, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weight = torch.clamp(terms.ratio, max=cfg.epsilon_high).detach()
        clipped = ((terms.ratio > cfg.epsilon_high) & (terms.advantages > 0)).float()
        return -weight * terms.advantages * terms.logps, {"cispo_clip_ratio": clipped}
