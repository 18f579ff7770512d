"""From the data settings to a recipe and the options its builder gets: the one place train, sft, eval and check
turn `data.recipe`, `data.dataset`, the column names and `data.recipe_options` into a dataset.

- `data.recipe` is a recipe's name, or `module:OBJECT` / `file.py:OBJECT`: a Recipe, or a callable that returns one,
  loaded from that module or file only.
- `data.dataset` is a local file or folder (the builder's `path`), a hub id (`hub_id`), or the record of rows given
  in Python (`memory:...`, the builder's `rows`), for recipes that read rows; `data.dataset_split` is the split
  trained on, `data.dataset_config` the dataset's configuration, `data.eval_dataset` the held-out data;
  `data.prompt_key` / `image_key` / `answer_key` go to recipes that take column names. Given to a recipe that
  cannot use them, they are an error naming the setting, never silently dropped.
- Rows given in Python (`GRPOTrainer(train_dataset=...)`) are kept for the process under a record naming their
  type, fingerprint, columns and size; that record is what `data.dataset` and config.yaml hold.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from vlm_grpo.file_kinds import special_kind
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.user_calls import call
from vlm_grpo.grpo.user_code import load_object
from vlm_grpo.recipes import Recipe, get_recipe
from vlm_grpo.recipes.readers import DATA_SUFFIXES, InMemoryRows

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name: a hub repo id (datasets, models)
COLUMN_SETTINGS = ("prompt_key", "image_key", "answer_key")
MEMORY = "memory:"  # data.dataset's prefix for rows given in Python
_IN_MEMORY: dict[str, InMemoryRows] = {}  # record -> the rows, for this process
VIDEO_SETTINGS = ("video_frames", "video_fps", "max_video_frames", "video_max_pixels")


def resolve_recipe(name: str) -> Recipe:
    """A registered recipe by name, or the user's Recipe from `module:OBJECT` / `file.py:OBJECT`."""
    if ":" not in name:
        return get_recipe(name)
    found = load_object(name, "recipe")
    recipe = call("recipe", found) if callable(found) and not isinstance(found, Recipe) else found
    if not isinstance(recipe, Recipe):
        made = " (returned by calling it)" if recipe is not found else ""
        raise ValueError(f"recipe {name!r}: expected a vlm_grpo.recipes.Recipe or a function returning one, "
                         f"got {type(recipe).__name__}{made}")
    return recipe


def describe_rows(data: Any) -> str:
    """Rows in memory as a record: their type, fingerprint (datasets' own, or its hasher's), columns and size."""
    import datasets
    from datasets.fingerprint import Hasher

    if isinstance(data, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        return f"{type(data).__name__}({', '.join(f'{k}={describe_rows(v)}' for k, v in data.items())})"
    if isinstance(data, (list, tuple)):
        columns = sorted({k for row in data if isinstance(row, dict) for k in row})
        kind, size = "list", len(data)
    else:
        columns = list(getattr(data, "column_names", None) or [])
        kind, size = type(data).__name__, getattr(data, "num_rows", None)
    fingerprint = getattr(data, "_fingerprint", None)
    if fingerprint is None:
        try:
            fingerprint = Hasher.hash(data)
        except Exception:  # noqa: BLE001 - some iterables cannot be hashed; the record says so
            fingerprint = "unhashable"
    rows = "" if size is None else f", rows={size}"
    return f"{kind}(fingerprint={fingerprint}, columns=[{', '.join(columns)}]{rows})"


def remember_rows(data: Any, name: str) -> str:
    """The record of rows given in Python (what data.dataset holds); the rows are kept for this process."""
    if isinstance(data, InMemoryRows):
        data = data.data
    record = MEMORY + describe_rows(data)
    _IN_MEMORY[record] = InMemoryRows(data, name)
    return record


def dataset_source(dataset: str, setting: str = "data.dataset") -> dict[str, Any]:
    """`{"path": ...}` for a local file or folder, `{"hub_id": ...}` for a hub id, `{"rows": ...}` for rows given in
    Python in this process; anything else is an error naming the setting."""
    if dataset.startswith(MEMORY):
        if dataset not in _IN_MEMORY:
            raise SettingError(setting, f"{dataset} records rows given in Python to another process: give a file, "
                               "folder or hub id")
        return {"rows": _IN_MEMORY[dataset]}
    path = Path(dataset).expanduser()
    kind = special_kind(path)
    if kind is not None and kind != "a directory":  # a folder is a dataset layout; a FIFO or device is not
        raise SettingError(setting, f"{dataset} is {kind}, not a data file or folder")
    if path.exists():
        return {"path": str(path)}
    looks_local = dataset.startswith((".", "/", "~")) or path.suffix in DATA_SUFFIXES
    if looks_local or not HUB_ID.fullmatch(dataset):
        raise SettingError(setting, f"no such file or folder: {dataset} (nor a hub id like owner/name)")
    return {"hub_id": dataset}


def build_options(recipe: Recipe, data, held_out: bool = False) -> dict[str, Any]:
    """The keyword options `recipe.build` gets from the data settings (besides split, size and seed); `held_out`:
    for the held-out evaluation, which reads data.eval_dataset when it is set."""
    options = dict(data.recipe_options)
    if recipe.checks_rows:
        options.setdefault("on_bad_sample", data.on_bad_sample)
    for key in ("dataset", "dataset_split", "dataset_config", "eval_dataset"):
        if getattr(data, key) is not None and not recipe.checks_rows:
            raise SettingError(f"data.{key}", f"recipe {recipe.name!r} makes its own data; the recipes that read a "
                               "dataset are trl, vsr, clevr_count, mm_math (and your own that set checks_rows)")
    source, setting = data.dataset, "data.dataset"
    if held_out and data.eval_dataset is not None:
        source, setting = data.eval_dataset, "data.eval_dataset"
    if source is not None:
        if "path" in options or "hub_id" in options:
            raise SettingError(setting, "data.recipe_options names a path or hub_id too: give the data once")
        options.update(dataset_source(source, setting))
        if data.dataset_config is not None and source == data.dataset:  # a configuration of data.dataset
            options["dataset_config"] = data.dataset_config
    for key in COLUMN_SETTINGS:
        value = getattr(data, key)
        if value is None:
            continue
        if not recipe.takes_columns:
            raise SettingError(f"data.{key}", f"recipe {recipe.name!r} has fixed column names; column settings "
                               "apply to the trl recipe (and your own that set takes_columns)")
        if options.get(key, value) != value:
            raise SettingError(f"data.{key}", f"{value!r} differs from data.recipe_options' {options[key]!r}")
        options[key] = value
    for key in VIDEO_SETTINGS:
        value = getattr(data, key)
        if recipe.takes_video:
            options.setdefault(key, value)
        elif value != type(data).__dataclass_fields__[key].default:
            raise SettingError(f"data.{key}", f"recipe {recipe.name!r} reads no videos; the video settings apply to the "
                               "trl and moving_square recipes (and your own that set takes_video)")
    return options


def build_split(recipe: Recipe, data, split: str, size: int, seed: int):
    """The recipe's samples of `split` (for training, data.dataset_split when set) with the run's data settings."""
    if split == "train" and data.dataset_split is not None:
        split = data.dataset_split
    return recipe.build(split=split, size=size, seed=seed, **build_options(recipe, data))


def heldout_build(recipe: Recipe, data, split: str, size: int, seed: int):
    """The recipe's held-out samples of `split`: from data.eval_dataset when set, else as training reads its data."""
    return recipe.build(split=split, size=size, seed=seed, **build_options(recipe, data, held_out=True))
