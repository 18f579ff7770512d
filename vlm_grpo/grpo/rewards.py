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


def run_rewards(recipe, specs: list[str]) -> list[Reward]:
    """The rewards a run scores with: `data.rewards` when given (it replaces the recipe's), else the recipe's."""
    return parse_reward_specs(specs) if specs else list(recipe.rewards)


def parse_reward_specs(specs: list[str]) -> list[Reward]:
    """`name=module:function*weight` entries (name and weight optional)."""
    rewards = []
    for spec in specs:
        name, _, rest = spec.partition("=") if "=" in spec.split(":")[0] else ("", "", spec)
        target, _, weight = rest.partition("*")
        fn = load_reward_function(target)
        rewards.append(Reward(name or fn.__name__, fn, float(weight) if weight else 1.0))
    return rewards


class RewardError(RuntimeError):
    """A reward function raised; the message names the reward and the sample that broke it."""


def _offending_sample(reward: Reward, completions: list[str], fields: dict[str, list[Any]]) -> tuple[int, BaseException]:
    """Re-run the reward one completion at a time to find the first one it fails on."""
    for i, completion in enumerate(completions):
        try:
            reward.fn(completions=[completion], **{k: [v[i]] for k, v in fields.items()})
        except Exception as err:  # noqa: BLE001 - user code may raise anything
            return i, err
    return -1, RuntimeError("fails only on the whole batch")


def _call(reward: Reward, completions: list[str], fields: dict[str, list[Any]], on_error: str, errors: dict[str, int]) -> list[float]:
    try:
        values = reward.fn(completions=completions, **fields)
    except Exception as err:  # noqa: BLE001
        index, cause = _offending_sample(reward, completions, fields)
        if on_error != "zero":
            where = f"completion {index} ({completions[index][:80]!r})" if index >= 0 else "the batch"
            raise RewardError(f"reward {reward.name!r} raised on {where}: {type(cause).__name__}: {cause}") from err
        # Score each completion alone so only the ones it fails on get 0.
        values = []
        for i, completion in enumerate(completions):
            try:
                values.extend(reward.fn(completions=[completion], **{k: [v[i]] for k, v in fields.items()}))
            except Exception:  # noqa: BLE001
                values.append(0.0)
                errors[reward.name] = errors.get(reward.name, 0) + 1
    if len(values) != len(completions):
        raise RewardError(f"reward {reward.name!r} returned {len(values)} scores for {len(completions)} completions")
    return values


def score(
    rewards: list[Reward],
    completions: list[str],
    fields: dict[str, list[Any]],
    on_error: str = "raise",
    errors: dict[str, int] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total weighted reward [N] and each component's raw scores [N].

    on_error="raise": a failing reward raises RewardError naming it and the completion it failed on;
    "zero": those completions score 0 for it, counted per reward in `errors`.
    """
    if on_error not in ("raise", "zero"):
        raise ValueError(f"on_reward_error must be raise or zero, not {on_error!r}")
    components: dict[str, torch.Tensor] = {}
    errors = {} if errors is None else errors
    total = torch.zeros(len(completions), dtype=torch.float32)
    for reward in rewards:
        values = _call(reward, completions, fields, on_error, errors)
        scores = torch.tensor([float(v) for v in values], dtype=torch.float32)
        components[reward.name] = scores
        total += reward.weight * scores
    return total, components
