"""Every model type the generic adapter serves, through every recipe: 2 GRPO steps each (and TRL-format rows).

Too slow for the default run (the default run trains a fixed subset: test_generic.py); run it with
`python -m pytest -m generic_matrix tests/adapters/test_generic_matrix.py`.
"""

from __future__ import annotations

import pytest

from tests.recipes.test_every_family import data  # noqa: F401  (the recipes' fixture rows)
from vlm_grpo.adapters.generic.status import generic_types
from vlm_grpo.adapters.registry import is_generic_type
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.trainer import GRPOTrainer
from vlm_grpo.recipes import get_recipe

pytestmark = pytest.mark.generic_matrix
RECIPES = ["shapes", "cryptogram", "vsr", "clevr_count", "mm_math"]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("model_type", [t for t in generic_types() if is_generic_type(t)])
def test_two_grpo_steps(model_type, recipe, data, tmp_path):  # noqa: F811
    cfg = load_config(overrides=[
        "--model", f"tiny:{model_type}", "--recipe", recipe, "--max-steps", "2", "--output-dir", str(tmp_path),
        "--max-new-tokens", "4", "--batch-size", "1", "--num-generations", "2", "--data.train-size", "2",
        "--logging.progress", "false", "--data.recipe_options", data[recipe],
    ])
    history = GRPOTrainer(cfg).train()
    assert [m["step"] for m in history] == [1, 2]
    assert {f"rewards/{r.name}" for r in get_recipe(recipe).rewards} <= set(history[0])
    assert (tmp_path / "final" / "config.json").is_file()
