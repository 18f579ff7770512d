"""The loss section of the settings: the options every loss shares (TRL 1.16's names and defaults), then the
settings each registered loss declares. Built from the registry, so a new loss file brings its own settings to
YAML, the command line and `--help` with nothing else edited.

`epsilon_high=None` resolves to `epsilon`; `max_completion_length` is derived from generation.max_new_tokens.
"""

from __future__ import annotations

import dataclasses
import logging

from vlm_grpo.grpo.algorithm.losses.base import LOSSES
from vlm_grpo.grpo.setting_fields import SettingError, check_fields, setting

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SEQUENCE_LEVEL_SUMS = ("bnpo", "dr_grpo", "dapo", "cispo")  # TRL warns: these sum tokens of a sequence-level ratio


def _shared_fields() -> list[tuple[str, type, dataclasses.Field]]:
    return [
        ("loss_type", str, setting("dapo", help=f"the policy loss: one of {' | '.join(sorted(LOSSES))}, or "
                                   "package.module:Class, a PolicyLoss subclass (docs/algorithms.md)")),
        ("epsilon", float, setting(0.2, help="clip range: the ratio is clipped below at 1 - epsilon", at_least=0.0,
                                   below=1.0)),
        ("epsilon_high", float | None, setting(None, help="clip range above, 1 + epsilon_high (cispo: the ratio's "
                                               "cap; None: epsilon)", at_least=0.0, at_most=10.0)),
        ("delta", float | None, setting(None, help="cap of the unclipped ratio (two-sided clipping, INTELLECT-2; "
                                        "None: off)", above=1.0, at_most=1e6)),
        ("beta", float, setting(0.0, help="KL coefficient (k3 estimator against the reference policy; 0: no "
                                "reference)", at_least=0.0, at_most=1e3)),
        ("importance_sampling_level", str, setting("token", help="importance ratio per token, or per sequence "
                                                   "(GSPO)", choices=IMPORTANCE_SAMPLING_LEVELS)),
        ("use_bias_correction_kl", bool, setting(True, help="multiply the KL term by the importance ratio (TRL's "
                                                 "default)")),
        ("mask_truncated_completions", bool, setting(False, help="completions cut at max_new_tokens (no EOS) train "
                                                     "on no token (DAPO's overlong filtering)")),
        ("top_entropy_quantile", float, setting(1.0, help="only the top quantile of tokens by entropy train (0.2 in "
                                                "'Beyond the 80/20 rule'; 1: all)", at_least=0.0, at_most=1.0)),
        ("off_policy_mask_threshold", float | None, setting(None, help="drop a negative-advantage sequence whose "
                                                            "mean KL from the sampling policy exceeds this "
                                                            "(DeepSeek-V3.2; None: off)", above=0.0, at_most=1e6)),
        ("entropy_coef", float, setting(0.0, help="entropy bonus: minus this x the mean entropy of the training "
                                        "tokens (the start value when adaptive)", at_least=-1e3, at_most=1e3)),
        ("use_adaptive_entropy", bool, setting(False, help="adapt entropy_coef each update toward entropy_target "
                                               "(Skywork-OR1)")),
        ("entropy_coef_min", float, setting(0.0, help="adaptive entropy: lowest coefficient", at_least=0.0, at_most=1e3)),
        ("entropy_coef_max", float, setting(1.0, help="adaptive entropy: highest coefficient", at_least=0.0, at_most=1e3)),
        ("entropy_coef_delta", float, setting(0.005, help="adaptive entropy: change per update", at_least=0.0, at_most=1.0)),
        ("entropy_target", float, setting(0.2, help="adaptive entropy: the bonus applies while the mean entropy "
                                          "(nats) is at or below this", at_least=0.0, at_most=1e3)),
        ("sync_ref_model", bool, setting(False, help="move the reference toward the policy every ref_model_sync_steps "
                                         "updates (TR-DPO; needs beta > 0, no LoRA)")),
        ("ref_model_mixup_alpha", float, setting(0.6, help="reference sync: ref = alpha x policy + (1 - alpha) x ref",
                                                 at_least=0.0, at_most=1.0)),
        ("ref_model_sync_steps", int, setting(512, help="reference sync: every this many optimizer updates",
                                              at_least=1, at_most=1_000_000_000)),
        ("router_aux_loss_coef", float | None, setting(None, help="mixture-of-experts models: weight of the "
                                                       "routers' load-balancing loss added to the loss, as TRL (None: "
                                                       "the model config's; 0: off; an error on a model without "
                                                       "routers)", at_least=0.0, at_most=1e3)),
        ("max_completion_length", int, setting(64, resume="ignored", help="dr_grpo's normaliser; a run sets it from "
                                               "generation.max_new_tokens", at_least=1, at_most=1_048_576)),
    ]


def _loss_fields() -> list[tuple[str, type, dataclasses.Field]]:
    fields, owner = [], {}
    for name in sorted(LOSSES):
        for key, field in LOSSES[name].settings.items():
            if key in owner:
                raise ValueError(f"losses {owner[key]!r} and {name!r} both declare the setting {key!r}")
            owner[key] = name
            fields.append((key, type(field.default), field))
    return fields


def _post_init(self) -> None:
    check_fields(self)
    for name in ("use_bias_correction_kl", "mask_truncated_completions", "use_adaptive_entropy", "sync_ref_model"):
        if not isinstance(getattr(self, name), bool):
            raise SettingError(name, f"{getattr(self, name)!r} is not a bool")
    if not isinstance(self.max_completion_length, int) or isinstance(self.max_completion_length, bool):
        raise SettingError("max_completion_length", f"{self.max_completion_length!r} is not an int")
    if self.epsilon_high is None:
        self.epsilon_high = self.epsilon
    if self.entropy_coef_min > self.entropy_coef_max:
        raise SettingError("entropy_coef_min", f"{self.entropy_coef_min} is above entropy_coef_max ({self.entropy_coef_max})")
    if self.sync_ref_model and self.beta == 0.0:
        raise SettingError("sync_ref_model", "needs a reference to sync: beta is 0 (set loss.beta > 0, as TRL "
                           "requires)")
    LOSSES[self.loss_type].check(self)  # an unknown name, or a path that does not import, is refused here
    if self.importance_sampling_level == "sequence" and self.loss_type in SEQUENCE_LEVEL_SUMS:
        # TRL 1.16 allows this combination and only warns; so do we.
        logging.getLogger(__name__).warning(
            f"With importance_sampling_level='sequence', the {self.loss_type!r} loss sums per-token "
            "contributions, which weights each sequence by its completion length instead of optimizing the "
            "per-sequence objective. The GSPO paper's setup is loss_type='grpo'.")


LossConfig = dataclasses.make_dataclass(
    "LossConfig",
    _shared_fields() + _loss_fields(),
    namespace={
        "__post_init__": _post_init,
        "__doc__": "The loss section: shared options (TRL 1.16's names and defaults), then each loss's own.",
        "__module__": __name__,
    },
)


def describe(cfg) -> str:
    """The loss section in a few words (the model card's "loss" row)."""
    return f"{cfg.loss_type}, epsilon {cfg.epsilon:g}, beta {cfg.beta:g}"
