"""The types the public trainers' arguments take, checked before anything is built (settings read, a run folder
made, a model loaded): a wrong one is one line naming the argument, what was given and what it takes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.grpo.setting_fields import ArgumentTypeError


def _given(value: Any) -> str:
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value)[:80]
    if isinstance(value, (list, tuple, dict)) and not value:
        return f"an empty {type(value).__name__}"
    return f"a {type(value).__name__}"


def refuse(name: str, value: Any, takes: str) -> None:
    raise ArgumentTypeError(f"{name}: got {_given(value)}; it takes {takes}")


def model_argument(model: Any) -> Any:
    """A model spec or path (a Path as its text), a transformers model (PEFT-wrapped too) or a vlm_grpo adapter."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if isinstance(model, str) and model.strip():
        return model
    if isinstance(model, VLMAdapter) or (not isinstance(model, (str, type)) and hasattr(model, "config")):
        return model
    refuse("model", model, "a model spec or path (e.g. 'tiny:smolvlm', 'runs/x/final', a hub id), a loaded "
           "transformers model or a vlm_grpo adapter")


def args_argument(args: Any, config_class: type) -> Any:
    """`args` as a config of `config_class` (None: its defaults; a mapping: its keywords)."""
    if args is None:
        return config_class()
    if isinstance(args, Mapping):
        bad = [k for k in args if not isinstance(k, str)]
        if bad:
            refuse("args", args, f"a {config_class.__name__} or a mapping of its keywords (names as strings, not "
                   f"{bad[0]!r})")
        return config_class(**args)
    if isinstance(args, config_class) and getattr(args, "stage", None) == config_class.stage:
        return args
    refuse("args", args, f"a vlm_grpo {config_class.__name__}, a mapping of its keywords, or None")


def _reward_item(item: Any) -> bool:
    return (isinstance(item, str) and bool(item.strip())) or callable(item) or hasattr(item, "config") \
        or isinstance(item, VLMAdapter)


def reward_funcs_argument(reward_funcs: Any) -> None:
    """None (the recipe's or the settings' rewards), one reward, or a non-empty list or tuple of them."""
    if reward_funcs is None:
        return
    items = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    takes = ("a reward function, a 'module:function' string, a reward model (id, path or loaded), or a non-empty "
             "list of them (None: the recipe's rewards)")
    if not items:
        refuse("reward_funcs", reward_funcs, takes)
    for item in items:
        if not _reward_item(item):
            refuse("reward_funcs", item, takes)


def _rows(data: Any) -> bool:
    """A dataset a run reads: a path or hub id, a datasets object (Dataset, IterableDataset, DatasetDict) or rows."""
    if isinstance(data, os.PathLike) or (isinstance(data, str) and data.strip()):
        return True
    if hasattr(data, "features") or type(data).__name__ in ("DatasetDict", "IterableDatasetDict"):
        return True
    return isinstance(data, (list, tuple)) and bool(data) and all(isinstance(row, Mapping) for row in data)


DATASET = "a datasets.Dataset, IterableDataset or DatasetDict, a non-empty list of row dicts, or a file path or hub id"


def dataset_argument(name: str, data: Any, named: bool = False) -> None:
    """`named`: a mapping of datasets by name is taken too (eval_dataset, as TRL's trainer takes it)."""
    if data is None or _rows(data):
        return
    if named and isinstance(data, Mapping) and data and all(isinstance(k, str) and _rows(v) for k, v in data.items()):
        return
    refuse(name, data, DATASET + (", or a dict of them by name" if named else "") + ", or None")


def callables_argument(name: str, value: Any, what: str) -> None:
    """None or a list / tuple of callables (`what` names them)."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or not all(callable(v) for v in value):
        refuse(name, value, f"a list of {what}, or None")


def callable_argument(name: str, value: Any, what: str) -> None:
    if value is not None and not callable(value):
        refuse(name, value, f"{what}, or None")


def environment_argument(value: Any) -> None:
    """None, a class (called for each rollout), or a dict of them picked by each row's environment field."""
    if value is None or callable(value):
        return
    if isinstance(value, Mapping) and value and all(isinstance(k, str) and callable(v) for k, v in value.items()):
        return
    refuse("environment_factory", value, "an environment class, a dict of them by name, or None")


def optimizers_argument(optimizers: Any) -> tuple:
    """TRL's (optimizer, scheduler) pair; None as TRL's default (None, None)."""
    if optimizers is None:
        return (None, None)
    if not isinstance(optimizers, (list, tuple)) or len(optimizers) != 2:
        refuse("optimizers", optimizers, "a pair (optimizer, lr_scheduler); here (None, None): the optimizer is "
               "built from the settings")
    return tuple(optimizers)


def check_common(model: Any, train_dataset: Any, eval_dataset: Any, callbacks: Any) -> Any:
    """What both trainers take alike; returns the model as the trainer reads it."""
    model = model_argument(model)
    dataset_argument("train_dataset", train_dataset)
    dataset_argument("eval_dataset", eval_dataset, named=True)
    if callbacks is not None and not isinstance(callbacks, (list, tuple)):
        refuse("callbacks", callbacks, "a list of TrainerCallback classes or instances, or None")
    return model
