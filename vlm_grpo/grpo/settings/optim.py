"""The optimizer section: learning rates per module group, freezing, the optimizer and its schedule."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from vlm_grpo.adapters.module_groups import GROUP_NAMES, SUB_GROUPS
from vlm_grpo.grpo.setting_fields import SettingError, check_fields, setting
from vlm_grpo.adapters.freeze import FREEZE_PRESETS, RENAMED_PRESETS

# transformers Trainer's optimizer names that run here (grpo/training/optimizer.py builds them with its own helper)
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adamw_bnb_8bit", "paged_adamw_8bit")


@dataclass
class OptimConfig:
    learning_rate: float = setting(1e-5, help="learning rate of every module group without its own", at_least=0.0, at_most=10.0)
    vision_lr: float | None = setting(None, help="vision tower learning rate (None: learning_rate)", at_least=0.0, at_most=10.0)
    projector_lr: float | None = setting(None, help="projector learning rate (None: learning_rate)", at_least=0.0, at_most=10.0)
    language_lr: float | None = setting(None, help="language model learning rate (None: learning_rate)", at_least=0.0, at_most=10.0)
    head_lr: float | None = setting(None, help="LM head learning rate (None: learning_rate)", at_least=0.0, at_most=10.0)
    experts_lr: float | None = setting(None, help="mixture-of-experts routers and experts, a part of the language "
                                       "model (None: language_lr)", at_least=0.0, at_most=10.0)
    weight_decay: float = setting(0.0, help="AdamW weight decay", at_least=0.0, at_most=10.0)
    adam_betas: tuple[float, float] = setting((0.9, 0.999), help="AdamW betas", at_least=0.0, below=1.0)
    adam_eps: float = setting(1e-8, help="AdamW epsilon", above=0.0, at_most=1.0)
    max_grad_norm: float = setting(1.0, help="clip the gradient norm to this (<= 0: measure only)", at_least=-1e9, at_most=1e9)
    freeze: list[str] = setting(factory=list, resume="fixed", help="module groups to freeze: vision, projector, language, head; "
                                "experts (a mixture-of-experts model's routers and experts, part of language)")
    trainable_patterns: list[str] = setting(factory=list, resume="fixed", help="regexes of parameter names trained again after freeze")
    freeze_preset: str | None = setting(None, resume="fixed", help="a named freeze policy: " + ", ".join(sorted(FREEZE_PRESETS)))
    optimizer: str = setting("adamw_torch", resume="fixed", help="the optimizer, by transformers Trainer's name: adamw_torch, "
                             "adamw_torch_fused, adafactor, sgd, adamw_bnb_8bit, paged_adamw_8bit (bitsandbytes)",
                             choices=OPTIMIZERS)
    lr_scheduler: str = setting("constant_with_warmup", help="any schedule transformers.get_scheduler knows")
    lr_scheduler_kwargs: dict[str, Any] = setting(factory=dict, help="the schedule's own arguments (get_scheduler's "
                                                  "scheduler_specific_kwargs, e.g. {num_cycles: 2})")
    warmup_steps: int = setting(0, help="warm-up steps (wins over warmup_ratio when > 0)", at_least=0, at_most=1_000_000_000)
    warmup_ratio: float = setting(0.0, help="warm-up as a share of the run's scheduler steps", at_least=0.0, at_most=1.0)

    def __post_init__(self) -> None:
        self.freeze = list(self.freeze)
        self.trainable_patterns = list(self.trainable_patterns)
        self.adam_betas = tuple(self.adam_betas)
        check_fields(self)
        unknown = [g for g in self.freeze if g not in GROUP_NAMES]
        if unknown:
            raise SettingError(
                "freeze", f"unknown module group(s) {unknown} in freeze; valid module groups: {', '.join(GROUP_NAMES)}"
            )
        if self.freeze_preset in RENAMED_PRESETS:  # a config written before the rename
            new = RENAMED_PRESETS[self.freeze_preset]
            logging.getLogger(__name__).warning("freeze preset %r is now called %r; the old name will be removed",
                                                self.freeze_preset, new)
            self.freeze_preset = new
        if self.freeze_preset is not None and self.freeze_preset not in FREEZE_PRESETS:
            raise SettingError("freeze_preset", f"unknown freeze preset {self.freeze_preset!r}; known presets: "
                               f"{', '.join(sorted(FREEZE_PRESETS))}")
        for pattern in self.trainable_patterns:
            try:
                re.compile(pattern)
            except re.error as err:
                raise SettingError("trainable_patterns", f"{pattern!r} is not a valid regex ({err})") from None
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise SettingError("adam_betas", f"{self.adam_betas!r} must be two numbers in [0, 1)")
        from transformers import SchedulerType

        try:
            SchedulerType(self.lr_scheduler)
        except ValueError:
            valid = ", ".join(s.value for s in SchedulerType)
            raise SettingError("lr_scheduler", f"unknown lr_scheduler {self.lr_scheduler!r}; transformers accepts: {valid}") from None

    def lr_for(self, group: str) -> float:
        """A group's learning rate; a sub-group without its own takes its group's."""
        if group not in GROUP_NAMES:
            raise ValueError(f"unknown module group {group!r}; valid module groups: {', '.join(GROUP_NAMES)}")
        lr = getattr(self, f"{group}_lr")
        if lr is None:
            return self.lr_for(SUB_GROUPS[group]) if group in SUB_GROUPS else self.learning_rate
        return lr

    def frozen_groups(self) -> set[str]:
        preset = FREEZE_PRESETS[self.freeze_preset] if self.freeze_preset else None
        return set(self.freeze) | set(preset.freeze if preset else ())
