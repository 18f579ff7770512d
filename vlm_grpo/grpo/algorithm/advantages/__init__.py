"""Advantage estimators, one module each, registered by name (`--advantage NAME`). Adding one is one file in this
folder: an `AdvantageEstimator` subclass with `@register` (see base.py), found by the scan below; one outside the
package is named as `package.module:Class` (registry.py)."""

from __future__ import annotations

import importlib
import pkgutil

from vlm_grpo.grpo.algorithm.advantages.base import ADVANTAGES, AdvantageEstimator, RewardScores, register

_NOT_ESTIMATORS = {"base", "aggregation"}  # the machinery every estimator shares
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _NOT_ESTIMATORS:
        importlib.import_module(f"{__name__}.{_module.name}")

from vlm_grpo.grpo.algorithm.advantages.aggregation import MULTI_OBJECTIVE, reward_scores  # noqa: E402

__all__ = ["ADVANTAGES", "MULTI_OBJECTIVE", "AdvantageEstimator", "RewardScores", "register", "reward_scores"]
