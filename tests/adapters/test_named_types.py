"""The model types users ask for by name that the generic adapter serves (no family file): each one gets what a
family file gets beyond the contract suite (which runs on every served type): the cache probe under simulated
faults, and 2 GRPO steps with one image per prompt and with two."""

from __future__ import annotations

import pytest

from tests.conftest import covering_pairs, tiny_adapter
from tests.recipes.helpers import check_two_grpo_steps
from vlm_grpo.adapters.generic.status import generic_types
from vlm_grpo.adapters.registry import is_generic_type
from vlm_grpo.compat.cache_probe import probe_cache
from vlm_grpo.compat.simulated_faults import IMAGE_FAULTS, simulated_fault

ASKED_FOR = ("paligemma", "llama4", "gemma3n", "minicpmv4_6", "molmo2", "kimi_k25")  # issue 38's list
NAMED = [t for t in ASKED_FOR if t in generic_types() and is_generic_type(t)]


def test_the_named_types_are_served():
    assert {"paligemma", "gemma3n", "minicpmv4_6", "molmo2", "kimi_k25"} <= set(NAMED), NAMED


@pytest.mark.parametrize("model_type, kind", covering_pairs(NAMED, list(IMAGE_FAULTS), 1, "fault_matrix"))
def test_every_simulated_fault_is_caught(model_type, kind):
    """Each type under one fault, each fault on one type; every pair under `-m fault_matrix`."""
    adapter = tiny_adapter(model_type)
    with simulated_fault(adapter, kind):
        report = probe_cache(adapter)
    assert not report.cache_ok, report.table()
    assert report.path_ok(False) or kind == "nan_weights", report.table()


TWO_IMAGES = ("compare_counts", "{image_size: 56, images_per_prompt: 2}")
ONE_IMAGE = ("shapes", "{image_size: 56}")


@pytest.mark.parametrize("model_type, recipe, options", [
    *[(t, *TWO_IMAGES) for t in NAMED],
    *[pytest.param(t, *ONE_IMAGE, marks=pytest.mark.recipe_matrix) for t in NAMED]])
def test_two_grpo_steps_with_two_images_per_prompt(model_type, recipe, options, tmp_path):
    """Two images in every prompt on each type (one image each: its cache probe in test_generic.py, and here under
    `-m recipe_matrix`)."""
    check_two_grpo_steps(f"tiny:{model_type}", recipe, options, tmp_path)


@pytest.mark.parametrize("model_type", [t for t in NAMED if t != "paligemma"])  # paligemma: test_generic's saved twin
def test_a_saved_checkpoint_loads_by_path_with_its_own_chat_template(model_type, tmp_path):
    """The real-checkpoint path offline: a saved twin loaded as `TYPE:DIR` and as a bare DIR keeps the processor's
    chat template (no placeholder fitted) and encodes and generates."""
    import torch

    from tests.adapters.samples import picture, user_turn
    from vlm_grpo.loader import load_model

    tiny_adapter(model_type).save(tmp_path)
    for spec in (f"{model_type}:{tmp_path}", str(tmp_path)):
        adapter = load_model(spec, device="cpu", dtype=torch.float32, decide_cache=False)
        assert adapter.family == model_type and adapter.calibration.placeholder is None
        assert adapter.processor.chat_template and adapter.tokenizer.chat_template
        batch = adapter.encode_prompts([user_turn(1, "Count the squares.")], [[picture(56, 56, 3)]])
        out = adapter.generate(batch, max_new_tokens=2, min_new_tokens=2)
        assert out.sequences.shape[1] == batch.input_ids.shape[1] + 2
