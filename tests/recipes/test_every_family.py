"""Every recipe runs 2 GRPO steps on every family's tiny twin: one flag switches the model."""

from __future__ import annotations

import pytest

from tests.recipes.helpers import save_image, write_jsonl
from vlm_grpo.grpo.run_settings import load_config
from vlm_grpo.grpo.trainer import GRPOTrainer
from vlm_grpo.recipes import get_recipe


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe-data")
    images = [save_image(root / "images" / f"{i}.png", i, size=56).name for i in range(2)]
    write_jsonl(root / "vsr" / "train.jsonl", [
        {"image": f"../images/{n}", "caption": "The cat is left of the dog.", "label": i % 2,
         "relation": "left of", "subj": "cat", "obj": "dog"} for i, n in enumerate(images)
    ])
    write_jsonl(root / "clevr" / "train.jsonl", [
        {"image": f"../images/{n}", "problem": "How many objects are there?", "thinking": "I count them.",
         "solution": str(i + 2)} for i, n in enumerate(images)
    ])
    write_jsonl(root / "math" / "train.jsonl", [
        {"image": f"../images/{n}", "problem": "What is the area of the square?", "solution": "$4$"}
        for n in images
    ])
    return {
        "shapes": "{image_size: 56}",
        "cryptogram": "{image_size: 56, max_words: 1}",
        "vsr": f"{{path: '{root / 'vsr'}'}}",
        "clevr_count": f"{{path: '{root / 'clevr'}'}}",
        "mm_math": f"{{path: '{root / 'math'}', image_size: 56}}",
    }


@pytest.mark.parametrize("recipe", ["shapes", "cryptogram", "vsr", "clevr_count", "mm_math"])
def test_two_grpo_steps(recipe, family, data, tmp_path):
    cfg = load_config(overrides=[
        "--model", f"tiny:{family}", "--recipe", recipe, "--max-steps", "2", "--output-dir", str(tmp_path),
        "--max-new-tokens", "4", "--batch-size", "1", "--num-generations", "2", "--data.train-size", "2",
        "--logging.progress", "false", "--data.recipe_options", data[recipe],
    ])
    history = GRPOTrainer(cfg).train()
    assert [m["step"] for m in history] == [1, 2]
    assert {f"rewards/{r.name}" for r in get_recipe(recipe).rewards} <= set(history[0])
    assert (tmp_path / "final" / "config.json").is_file()


def test_row_checking_recipes_declare_it():
    """The trainer passes data.on_bad_sample to exactly the recipes that declare `checks_rows`."""
    import inspect

    from vlm_grpo.recipes import RECIPES

    for name, recipe in RECIPES.items():
        takes_it = "on_bad_sample" in inspect.signature(recipe.build).parameters
        assert recipe.checks_rows == takes_it, name
