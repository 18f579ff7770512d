"""Recipes: dataset builder + prompt + named rewards + defaults, one module per task."""

from __future__ import annotations

from vlm_grpo.recipes.base import Recipe, Reward, Sample
from vlm_grpo.recipes import (
    clevr_count, compare_counts, count_price, cryptogram, mm_math, moving_square, scene_count, shapes, trl_format, vsr, zoom,
)

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (shapes.RECIPE, cryptogram.RECIPE, vsr.RECIPE, clevr_count.RECIPE, mm_math.RECIPE, trl_format.RECIPE,
              moving_square.RECIPE, compare_counts.RECIPE, zoom.RECIPE, count_price.RECIPE,
              scene_count.RECIPE)
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; available recipes: {', '.join(sorted(RECIPES))}, or your own "
                         "as module:OBJECT or file.py:OBJECT")
    return RECIPES[name]


__all__ = ["RECIPES", "Recipe", "Reward", "Sample", "get_recipe"]
