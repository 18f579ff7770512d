"""Every recipe runs 2 GRPO steps on the families' tiny twins: one flag switches the model."""

from __future__ import annotations

import pytest

from tests.conftest import _families, covering_pairs
from tests.recipes.helpers import IMAGE_RECIPES, check_two_grpo_steps, save_image, write_jsonl


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


@pytest.mark.parametrize("family, recipe", covering_pairs(_families(), IMAGE_RECIPES, 1, "recipe_matrix"))
def test_two_grpo_steps(recipe, family, data, tmp_path):
    """Each family with one recipe, each recipe on 3-4 families (one image, two and four on every family:
    tests/grpo/test_media_training.py); every pair under `-m recipe_matrix`."""
    check_two_grpo_steps(f"tiny:{family}", recipe, data[recipe], tmp_path)


MY_REWARDS = """
def accuracy(completions, solution, **kwargs):
    replies = [completion[0]["content"] for completion in completions]
    return [1.0 if answer in reply else 0.0 for reply, answer in zip(replies, solution)]
"""


def test_your_data_and_trl_rewards_from_the_command_line(family, tmp_path, monkeypatch):
    """`vlm-grpo train --dataset ./my.jsonl --reward trl.rewards:... --reward my_rewards.py:...` on every family:
    the step metrics, the completions log, the last checkpoint and a final/ the family's model class loads."""
    from vlm_grpo.adapters.registry import family_class
    from vlm_grpo.cli import main
    from vlm_grpo.grpo.run.logs import read_jsonl

    monkeypatch.chdir(tmp_path)
    save_image(tmp_path / "red.png", 0, size=56)
    write_jsonl(tmp_path / "my.jsonl", [
        {"prompt": [{"role": "system", "content": "Think first, in <think> </think>."},
                    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}],
         "image": "red.png", "solution": "red"},
        {"prompt": [{"role": "user", "content": "Name the colour."}], "images": ["red.png"], "solution": "red"},
    ])
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    code = main(["train", "--model", f"tiny:{family}", "--dataset", "./my.jsonl",
                 "--reward", "trl.rewards:think_format_reward", "--reward", "my_rewards.py:accuracy", "--max-steps", "2",
                 "--output-dir", "run", "--max-new-tokens", "4", "--batch-size", "1", "--num-generations", "2",
                 "--logging.progress", "false"])
    assert code == 0
    run = tmp_path / "run"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert {"rewards/think_format_reward", "rewards/accuracy", "reward", "entropy", "completion_length",
            "clip_ratio/region_mean", "frac_reward_zero_std", "loss"} <= set(metrics[0])
    completions = read_jsonl(run / "completions.jsonl")
    assert len(completions) == 2 * 1 * 2  # steps x prompts x generations
    assert set(completions[0]["rewards"]) == {"think_format_reward", "accuracy"}
    reloaded = family_class(family).model_class.from_pretrained(run / "final")  # the family's own class reads it
    assert sum(p.numel() for p in reloaded.parameters()) > 0
    assert (run / "checkpoint-2" / "optimizer.pt").is_file()


def test_row_checking_recipes_declare_it():
    """The trainer passes data.on_bad_sample to exactly the recipes that declare `checks_rows`."""
    import inspect

    from vlm_grpo.recipes import RECIPES

    for name, recipe in RECIPES.items():
        params = inspect.signature(recipe.build).parameters
        assert recipe.checks_rows == ("on_bad_sample" in params), name
        assert recipe.takes_columns == ("prompt_key" in params), name  # data.prompt_key etc. go to exactly these
