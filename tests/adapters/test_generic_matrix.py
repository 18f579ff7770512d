"""Every model type the generic adapter serves, through every recipe: 2 GRPO steps each (and TRL-format rows).

Too slow for the default run (the default run trains a fixed subset: test_generic.py); run it with
`python -m pytest -m generic_matrix tests/adapters/test_generic_matrix.py`.
"""

from __future__ import annotations

import pytest

from tests.recipes.helpers import IMAGE_RECIPES, check_two_grpo_steps
from tests.recipes.test_every_family import data  # noqa: F401  (the recipes' fixture rows)
from vlm_grpo.adapters.generic.status import generic_types
from vlm_grpo.adapters.registry import is_generic_type

pytestmark = pytest.mark.generic_matrix


@pytest.mark.parametrize("recipe", IMAGE_RECIPES)
@pytest.mark.parametrize("model_type", [t for t in generic_types() if is_generic_type(t)])
def test_two_grpo_steps(model_type, recipe, data, tmp_path):  # noqa: F811
    check_two_grpo_steps(f"tiny:{model_type}", recipe, data[recipe], tmp_path)
