"""Policy losses, one module each, registered by name (`loss_type`). Adding a loss is one file in this folder:
a `PolicyLoss` subclass with `@register` (see base.py); the scan below finds it, `--loss-type NAME` selects it, and
the docs tables and the tests' loops list it (docs/algorithms.md). An option of its own is a field of `LossConfig`
(config.py) that the class names in `settings`. A class outside the package is named as `package.module:Class`
instead (registry.py)."""

from __future__ import annotations

import importlib
import pkgutil

from vlm_grpo.grpo.algorithm.losses.base import LOSSES, NORMALISATIONS, PolicyLoss, register

_NOT_LOSSES = {"base", "clipped", "config", "entropy_control", "objective"}  # the machinery every loss shares
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _NOT_LOSSES:
        importlib.import_module(f"{__name__}.{_module.name}")

from vlm_grpo.grpo.algorithm.losses.config import LossConfig, describe  # noqa: E402 - its help lists the registry
from vlm_grpo.grpo.algorithm.losses.entropy_control import EntropyControl  # noqa: E402
from vlm_grpo.grpo.algorithm.losses.objective import (  # noqa: E402
    Collective, LossInputs, PolicyObjective, policy_loss)

__all__ = ["LOSSES", "NORMALISATIONS", "Collective", "EntropyControl", "LossConfig", "LossInputs", "PolicyLoss",
           "PolicyObjective", "describe", "policy_loss", "register"]
