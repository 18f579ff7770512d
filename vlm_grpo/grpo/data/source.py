"""From the data settings to a recipe and the options its builder gets: the one place train, sft, eval and check
turn `data.recipe`, `data.dataset`, the column names and `data.recipe_options` into a dataset.

- `data.recipe` is a recipe's name, or `module:OBJECT` / `file.py:OBJECT`: a Recipe, or a callable that returns one,
  loaded from that module or file only.
- `data.dataset` is a local file or folder (the builder's `path`) or a hub id (`hub_id`), for recipes that read
  rows; `data.prompt_key` / `image_key` / `answer_key` go to recipes that take column names. Given to a recipe
  that cannot use them, they are an error naming the setting, never silently dropped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from vlm_grpo.grpo.settings.fields import SettingError
from vlm_grpo.grpo.user_code import load_object
from vlm_grpo.recipes import Recipe, get_recipe
from vlm_grpo.recipes.rows import DATA_SUFFIXES

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name: a hub repo id (datasets, models)
COLUMN_SETTINGS = ("prompt_key", "image_key", "answer_key")
VIDEO_SETTINGS = ("video_frames", "video_fps", "max_video_frames", "video_max_pixels")


def resolve_recipe(name: str) -> Recipe:
    """A registered recipe by name, or the user's Recipe from `module:OBJECT` / `file.py:OBJECT`."""
    if ":" not in name:
        return get_recipe(name)
    found = load_object(name, "recipe")
    recipe = found() if callable(found) and not isinstance(found, Recipe) else found
    if not isinstance(recipe, Recipe):
        made = " (returned by calling it)" if recipe is not found else ""
        raise ValueError(f"recipe {name!r}: expected a vlm_grpo.recipes.Recipe or a function returning one, "
                         f"got {type(recipe).__name__}{made}")
    return recipe


def dataset_source(dataset: str) -> dict[str, str]:
    """`{"path": ...}` for a local file or folder, `{"hub_id": ...}` for a hub id; neither is an error."""
    path = Path(dataset).expanduser()
    if path.exists():
        return {"path": str(path)}
    looks_local = dataset.startswith((".", "/", "~")) or path.suffix in DATA_SUFFIXES
    if looks_local or not HUB_ID.fullmatch(dataset):
        raise SettingError("data.dataset", f"no such file or folder: {dataset} (nor a hub id like owner/name)")
    return {"hub_id": dataset}


def build_options(recipe: Recipe, data) -> dict[str, Any]:
    """The keyword options `recipe.build` gets from the data settings (besides split, size and seed)."""
    options = dict(data.recipe_options)
    if recipe.checks_rows:
        options.setdefault("on_bad_sample", data.on_bad_sample)
    if data.dataset is not None:
        if not recipe.checks_rows:
            raise SettingError("data.dataset", f"recipe {recipe.name!r} makes its own data; the recipes that read a "
                               "dataset are trl, vsr, clevr_count, mm_math (and your own that set checks_rows)")
        if "path" in options or "hub_id" in options:
            raise SettingError("data.dataset", "data.recipe_options names a path or hub_id too: give the data once")
        options.update(dataset_source(data.dataset))
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
    """The recipe's samples of `split` with the run's data settings."""
    return recipe.build(split=split, size=size, seed=seed, **build_options(recipe, data))
