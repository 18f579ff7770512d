"""Scoring completions with named, weighted reward functions; each component is kept for logging."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

from vlm_grpo.recipes.base import Reward


def load_reward_function(spec: str):
    """`package.module:function` or `path/to/file.py:function`: only the code the user names is loaded."""
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"reward function {spec!r}: expected module:function or file.py:function")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"reward function {spec!r}: no such file {path}")
        loader_spec = importlib.util.spec_from_file_location(f"vlm_grpo_user_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[loader_spec.name] = module
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ValueError(f"reward function {spec!r}: {module_name} has no function {func_name!r}")
    return fn


def parse_reward_specs(specs: list[str]) -> list[Reward]:
    """`name=module:function*weight` entries (name and weight optional)."""
    rewards = []
    for spec in specs:
        name, _, rest = spec.partition("=") if "=" in spec.split(":")[0] else ("", "", spec)
        target, _, weight = rest.partition("*")
        fn = load_reward_function(target)
        rewards.append(Reward(name or fn.__name__, fn, float(weight) if weight else 1.0))
    return rewards


def score(rewards: list[Reward], completions: list[str], fields: dict[str, list[Any]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total weighted reward [N] and each component's raw scores [N]."""
    components: dict[str, torch.Tensor] = {}
    total = torch.zeros(len(completions), dtype=torch.float32)
    for reward in rewards:
        values = reward.fn(completions=completions, **fields)
        if len(values) != len(completions):
            raise ValueError(f"reward {reward.name!r} returned {len(values)} scores for {len(completions)} completions")
        scores = torch.tensor([float(v) for v in values], dtype=torch.float32)
        components[reward.name] = scores
        total += reward.weight * scores
    return total, components
