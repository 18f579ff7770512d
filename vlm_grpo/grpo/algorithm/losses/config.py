"""The loss section of the settings: the options every loss shares (TRL 1.16's names and defaults), then the
options of particular losses (each loss names the ones it reads in its class's `settings`).

The help of `loss_type` lists the registered losses: the package imports this module after its scan of the loss
files (losses/__init__.py). `epsilon_high=None` resolves to `epsilon`; `max_completion_length` is derived from
generation.max_new_tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

from vlm_grpo.grpo.algorithm.losses.base import LOSSES
from vlm_grpo.grpo.setting_fields import SettingError, check_fields, setting

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


@dataclass
class LossConfig:
    """The loss section: shared options (TRL 1.16's names and defaults), then the options of particular losses."""

    loss_type: str = setting("dapo", help=f"the policy loss: one of {' | '.join(sorted(LOSSES))}, or "
                             "package.module:Class, a PolicyLoss subclass (docs/algorithms.md)")
    epsilon: float = setting(0.2, help="clip range: the ratio is clipped below at 1 - epsilon", at_least=0.0,
                             below=1.0)
    epsilon_high: float | None = setting(None, help="clip range above, 1 + epsilon_high (cispo: the ratio's cap; "
                                         "None: epsilon)", at_least=0.0, at_most=10.0)
    delta: float | None = setting(None, help="cap of the unclipped ratio (two-sided clipping, INTELLECT-2; None: off)",
                                  above=1.0, at_most=1e6)
    beta: float = setting(0.0, help="KL coefficient (k3 estimator against the reference policy; 0: no reference)",
                          at_least=0.0, at_most=1e3)
    importance_sampling_level: str = setting("token", help="importance ratio per token, or per sequence (GSPO)",
                                             choices=IMPORTANCE_SAMPLING_LEVELS)
    use_bias_correction_kl: bool = setting(True, help="multiply the KL term by the importance ratio (TRL's default)")
    mask_truncated_completions: bool = setting(False, help="completions cut at max_new_tokens (no EOS) train on no "
                                               "token (DAPO's overlong filtering)")
    top_entropy_quantile: float = setting(1.0, help="only the top quantile of tokens by entropy train (0.2 in "
                                          "'Beyond the 80/20 rule'; 1: all)", at_least=0.0, at_most=1.0)
    off_policy_mask_threshold: float | None = setting(None, help="drop a negative-advantage sequence whose mean KL "
                                                      "from the sampling policy exceeds this (DeepSeek-V3.2; None: "
                                                      "off)", above=0.0, at_most=1e6)
    entropy_coef: float = setting(0.0, help="entropy bonus: minus this x the mean entropy of the training tokens (the "
                                  "start value when adaptive)", at_least=-1e3, at_most=1e3)
    use_adaptive_entropy: bool = setting(False, help="adapt entropy_coef each update toward entropy_target "
                                         "(Skywork-OR1)")
    entropy_coef_min: float = setting(0.0, help="adaptive entropy: lowest coefficient", at_least=0.0, at_most=1e3)
    entropy_coef_max: float = setting(1.0, help="adaptive entropy: highest coefficient", at_least=0.0, at_most=1e3)
    entropy_coef_delta: float = setting(0.005, help="adaptive entropy: change per update", at_least=0.0, at_most=1.0)
    entropy_target: float = setting(0.2, help="adaptive entropy: the bonus applies while the mean entropy (nats) is "
                                    "at or below this", at_least=0.0, at_most=1e3)
    sync_ref_model: bool = setting(False, help="move the reference toward the policy every ref_model_sync_steps "
                                   "updates (TR-DPO; needs beta > 0, no LoRA)")
    ref_model_mixup_alpha: float = setting(0.6, help="reference sync: ref = alpha x policy + (1 - alpha) x ref",
                                           at_least=0.0, at_most=1.0)
    ref_model_sync_steps: int = setting(512, help="reference sync: every this many optimizer updates", at_least=1,
                                        at_most=1_000_000_000)
    router_aux_loss_coef: float | None = setting(None, help="mixture-of-experts models: weight of the routers' "
                                                 "load-balancing loss added to the loss, as TRL (None: the model "
                                                 "config's; 0: off; an error on a model without routers)",
                                                 at_least=0.0, at_most=1e3)
    max_completion_length: int = setting(64, resume="ignored", help="dr_grpo's normaliser; a run sets it from "
                                         "generation.max_new_tokens", at_least=1, at_most=1_048_576)
    # -- options of particular losses (the loss class names them in `settings`; the docs tables show them there)
    gmpo_clip: float = setting(0.4, help="gmpo: clip range of each token's log ratio, (-c, c) (the paper's 0.4)",
                               above=0.0, at_most=100.0)
    sapo_temperature_neg: float = setting(1.05, help="sapo: gate temperature for tokens with advantage <= 0",
                                          above=0.0, at_most=100.0)
    sapo_temperature_pos: float = setting(1.0, help="sapo: gate temperature for tokens with advantage > 0",
                                          above=0.0, at_most=100.0)
    vespo_k_pos: float = setting(2.0, help="vespo: power k for advantages >= 0", at_least=0.0, at_most=1e3)
    vespo_lambda_pos: float = setting(3.0, help="vespo: decay lambda for advantages >= 0", at_least=0.0, at_most=1e3)
    vespo_k_neg: float = setting(3.0, help="vespo: power k for advantages < 0", at_least=0.0, at_most=1e3)
    vespo_lambda_neg: float = setting(2.0, help="vespo: decay lambda for advantages < 0", at_least=0.0, at_most=1e3)

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("use_bias_correction_kl", "mask_truncated_completions", "use_adaptive_entropy", "sync_ref_model"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(name, f"{getattr(self, name)!r} is not a bool")
        if not isinstance(self.max_completion_length, int) or isinstance(self.max_completion_length, bool):
            raise SettingError("max_completion_length", f"{self.max_completion_length!r} is not an int")
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        if self.entropy_coef_min > self.entropy_coef_max:
            raise SettingError("entropy_coef_min", f"{self.entropy_coef_min} is above entropy_coef_max "
                               f"({self.entropy_coef_max})")
        if self.sync_ref_model and self.beta == 0.0:
            raise SettingError("sync_ref_model", "needs a reference to sync: beta is 0 (set loss.beta > 0, as TRL "
                               "requires)")
        loss = LOSSES[self.loss_type]  # an unknown name, or a path that does not import, is refused here
        unknown = [name for name in loss.settings if name not in LOSS_FIELDS]
        if unknown:
            raise SettingError("loss_type", f"{self.loss_type!r}: it declares settings ({', '.join(unknown)}), which "
                               "are not fields of the loss section: add them to LossConfig "
                               "(vlm_grpo/grpo/algorithm/losses/config.py), or read constants from the class")
        loss.check(self)
        if self.importance_sampling_level == "sequence" and loss.sums_sequence_ratio:
            # TRL 1.16 allows this combination and only warns; so do we.
            logging.getLogger(__name__).warning(
                f"With importance_sampling_level='sequence', the {self.loss_type!r} loss sums per-token "
                "contributions, which weights each sequence by its completion length instead of optimizing the "
                "per-sequence objective. The GSPO paper's setup is loss_type='grpo'.")


LOSS_FIELDS = {f.name: f for f in fields(LossConfig)}


def describe(cfg) -> str:
    """The loss section in a few words (the model card's "loss" row)."""
    return f"{cfg.loss_type}, epsilon {cfg.epsilon:g}, beta {cfg.beta:g}"
