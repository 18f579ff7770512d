"""Bring your own data, rewards and recipe from the command line: --dataset, --reward, column names, module:OBJECT."""

from __future__ import annotations

import pytest

from vlm_grpo.cli import main
from vlm_grpo.grpo.data.recipe_source import build_options, resolve_recipe
from vlm_grpo.grpo.settings.sources import load_config, load_recipe_config
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.recipes import get_recipe


def test_a_dataset_without_a_recipe_means_trl_rows(tmp_path):
    data = tmp_path / "my.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    cfg, recipe = load_recipe_config(overrides=["--dataset", str(data), "--prompt-key", "question"])
    assert cfg.data.recipe == "trl" and recipe is get_recipe("trl")
    assert build_options(recipe, cfg.data) == {"on_bad_sample": "error", "path": str(data), "prompt_key": "question",
                                               "video_frames": 8, "video_fps": 0.0, "max_video_frames": 16,
                                               "video_max_pixels": 224 * 224}  # trl reads videos too
    assert load_config().data.recipe == "shapes"  # no dataset, no recipe: the default task
    # a file recipe reads the dataset as its own path, a hub id goes to datasets
    vsr = load_config(overrides=["--recipe", "vsr", "--dataset", "someone/vsr-export"])
    assert build_options(get_recipe("vsr"), vsr.data)["hub_id"] == "someone/vsr-export"
    twice = load_config(overrides=["--dataset", str(data), "--data.recipe_options", f"{{path: {data}}}"])
    with pytest.raises(SettingError, match="give the data once"):
        build_options(get_recipe("trl"), twice.data)
    # video settings given to a recipe that reads no videos are an error, never dropped
    with pytest.raises(SettingError, match="data.video_frames.*reads no videos"):
        build_options(get_recipe("shapes"), load_config(overrides=["--data.video-frames", "4"]).data)


RECIPE_FILE = '''
from vlm_grpo.recipes import Recipe, Reward, get_recipe

def count(completions, **kwargs):
    return [float(len(c)) for c in completions]

RECIPE = Recipe("mine", build=get_recipe("shapes").build, rewards=[Reward("count", count)])

def make():
    return RECIPE

NOT_A_RECIPE = 3
'''


def test_your_own_recipe_from_a_file_or_a_module(tmp_path, capsys):
    path = tmp_path / "my_recipe.py"
    path.write_text(RECIPE_FILE)
    assert resolve_recipe(f"{path}:RECIPE").name == "mine"
    assert resolve_recipe(f"{path}:make").name == "mine"  # a function returning a Recipe
    assert resolve_recipe("vlm_grpo.recipes.vsr:RECIPE") is get_recipe("vsr")
    with pytest.raises(ValueError, match=r"expected a vlm_grpo.recipes.Recipe or a function returning one, got int"):
        resolve_recipe(f"{path}:NOT_A_RECIPE")
    with pytest.raises(ValueError, match="has no object 'NOPE'"):
        resolve_recipe(f"{path}:NOPE")
    with pytest.raises(ValueError, match="no such file"):
        resolve_recipe(f"{tmp_path}/missing.py:RECIPE")
    cfg, recipe = load_recipe_config(overrides=["--recipe", f"{path}:RECIPE"])
    assert recipe.name == "mine" and cfg.data.recipe == f"{path}:RECIPE"
    assert main(["train", "--recipe", f"{path}:NOT_A_RECIPE"]) == 1
    assert "expected a vlm_grpo.recipes.Recipe" in capsys.readouterr().err


def test_help_lists_the_data_settings(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for key in ("--data.dataset", "--data.prompt_key", "--data.image_key", "--data.answer_key", "--data.reward_weights",
                "--reward SPEC"):
        assert key in out, key
