"""The shipped `pretrained:shapes-tiny` checkpoint and the default run (`vlm-grpo train` with no arguments)."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo import pretrained
from vlm_grpo.adapters.families.hybrid_llava import LlavaHybridAdapter
from vlm_grpo.loader import load_model
from vlm_grpo.grpo.training.policy import load_policy
from vlm_grpo.grpo.settings.sources import load_recipe_config
from vlm_grpo.grpo.heldout_eval import evaluate_run
from vlm_grpo.recipes import get_recipe

SHIPPED = pretrained.path("shapes-tiny")


def test_shipped_checkpoint_is_a_small_safetensors_hybrid_llava():
    files = {p.name for p in SHIPPED.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "processor_config.json", "README.md"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in files)  # safetensors only
    assert sum(p.stat().st_size for p in SHIPPED.iterdir()) < 8 * 2**20  # a few MB inside the package
    adapter = load_model("pretrained:shapes-tiny")
    assert isinstance(adapter, LlavaHybridAdapter)
    # ... and the same weights as an ordinary checkpoint: `--model PATH` loads it too
    plain = load_model(str(SHIPPED))
    assert all(torch.equal(a, b) for a, b in zip(adapter.model.state_dict().values(), plain.model.state_dict().values()))


def test_unknown_pretrained_name_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="shapes-tiny"):
        load_model("pretrained:nope")


def test_default_config_is_the_shipped_checkpoint_on_shapes():
    cfg, _ = load_recipe_config(None, [])  # what `vlm-grpo train` with no arguments runs
    assert cfg.model.name == "pretrained:shapes-tiny" and cfg.model.init_from is None
    assert cfg.data.recipe == "shapes"
    assert cfg.eval.before_after and cfg.eval.size == 200 and cfg.logging.plot
    for section, values in pretrained.RUN_DEFAULTS["shapes-tiny"].items():
        if not isinstance(values, dict):  # a top-level setting (max_steps)
            assert getattr(cfg, section) == values, section
            continue
        for key, value in values.items():
            assert getattr(getattr(cfg, section), key) == value, f"{section}.{key}"
    adapter = load_policy(cfg, torch.device("cpu"))
    assert adapter.model.config.model_type == "llava"


def test_command_line_wins_and_other_models_get_no_shipped_run_settings():
    cfg, _ = load_recipe_config(None, ["--eval.size", "10", "--max-steps", "2"])
    assert cfg.eval.size == 10 and cfg.max_steps == 2 and cfg.eval.before_after
    tiny, _ = load_recipe_config(None, ["--model", "tiny:qwen2_5_vl"])
    assert not tiny.eval.before_after and not tiny.logging.plot and tiny.data.recipe_options == {}
    started, _ = load_recipe_config(None, ["--init-from", "/some/sft/final"])
    assert not started.eval.before_after  # a run from another checkpoint is not the shipped one's


def test_cross_setting_checks_see_the_shipped_defaults():
    # the shipped run's batch of 16 prompts divides into 4 micro-batches; the bare default (2) would not
    cfg, _ = load_recipe_config(None, ["--gradient-accumulation-steps", "4"])
    assert (cfg.data.batch_size, cfg.gradient_accumulation_steps) == (16, 4)


def test_shipped_checkpoint_counts_shapes_on_200_held_out_images():
    """The README's claim (>= 50% on held-out shapes, chance 20%), with room for noise: > 40% on 200 fixed images."""
    cfg, _ = load_recipe_config(None, [])
    adapter = load_policy(cfg, torch.device("cpu"))
    report = evaluate_run(adapter, get_recipe("shapes"), cfg)
    assert report["size"] == 200 and report["split"] == "test"
    assert report["accuracy"] > 0.40, report["accuracy"]
