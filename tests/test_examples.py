"""Every config in examples/ loads, and runs one step with its model swapped for the family's tiny twin."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recipes.helpers import save_image, write_jsonl
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

import yaml

ALL = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
# an experiment (compose, align, sft, grpo, eval sections) runs by `vlm-grpo experiment`: its stages are tested at toy
# scale in tests/real/test_experiment_pipeline.py; every other example is a `vlm-grpo train` config
EXPERIMENTS = [p for p in ALL if "compose" in yaml.safe_load(p.read_text())]
EXAMPLES = [p for p in ALL if p not in EXPERIMENTS]
SMALL = ["--batch-size", "1", "--num-generations", "2", "--max-new-tokens", "4", "--max-steps", "1",
         "--eval.size", "2", "--logging.progress", "false", "--mixed-precision", "no", "--dtype", "auto"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Tiny local stand-ins for the examples' data folders."""
    root = tmp_path_factory.mktemp("example-data")
    names = [save_image(root / "images" / f"{i}.png", i, size=56).name for i in range(2)]
    write_jsonl(root / "clevr" / "train.jsonl", [
        {"image": f"../images/{n}", "problem": "How many objects?", "thinking": "I count.", "solution": "2"} for n in names])
    write_jsonl(root / "mm_math" / "train.jsonl", [
        {"image": f"../images/{n}", "problem": "What is 1 + 1?", "solution": "$2$"} for n in names])
    turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 1 + 1?"}]}]
    write_jsonl(root / "trl" / "my.jsonl", [{"prompt": turn, "image": f"../images/{n}", "solution": "$2$"} for n in names])
    return root


def test_there_are_examples():
    assert len(EXAMPLES) >= 3 and EXPERIMENTS


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_experiment_stages_are_valid_settings(path):
    """Each training stage's settings load as `vlm-grpo sft/train` would load them (a wrong key fails here, in the
    fast tier, not after the stages before it ran)."""
    from vlm_grpo.experiment.plan import TRAINING_STAGES, read_experiment
    from vlm_grpo.experiment.preflight import check_experiment
    from vlm_grpo.experiment.stages import own_settings, stage_settings
    from vlm_grpo.grpo.settings.sources import load_recipe_config
    from vlm_grpo.recipes import get_recipe

    exp = read_experiment(path)
    check_experiment(exp, exp.stage_names(), [0, 1, 2])  # what `vlm-grpo experiment` checks before its first stage: eval splits too
    for stage in (*TRAINING_STAGES, *exp.arms):  # the arms too: a GRPO variant's `set` over grpo's settings
        if stage == "align" and exp.aligns_to_words():  # no trainer settings: its recipe names every cell's words
            task = exp.stages[stage]["data"]
            sample = get_recipe(task["recipe"]).build(split="train", size=1, **task.get("recipe_options", {}))[0]
            assert sample.fields["cell_words"], stage
            continue
        cfg, recipe = load_recipe_config(settings=stage_settings(exp, stage, seed=0))
        assert cfg.max_steps > 0 and cfg.logging.output_dir == str(exp.stage_dir(stage, 0)), stage
        assert recipe.name == own_settings(exp, stage)["data"]["recipe"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_one_step_on_the_tiny_twin(path, data, tmp_path):
    cfg = load_config(path)
    family = cfg.model.name.split(":", 1)[0]
    options = dict(cfg.data.recipe_options)
    if "path" in options:
        options["path"] = str(data / Path(options["path"]).name)
    if cfg.data.recipe in ("shapes", "cryptogram"):
        options.setdefault("image_size", 56)
    dataset = ["--dataset", str(data / "trl" / Path(cfg.data.dataset).name)] if cfg.data.dataset else []
    cfg = load_config(path, ["--model", f"tiny:{family}", "--output-dir", str(tmp_path / "run"),
                             "--data.recipe_options", repr(options), *dataset, *SMALL])
    history = trained(GRPOTrainer.from_settings(cfg))
    final = tmp_path / "run" / "final"
    assert [m["step"] for m in history] == [1]
    assert (final / "config.json").is_file() or (final / "merged" / "config.json").is_file()  # LoRA: adapter + merged
