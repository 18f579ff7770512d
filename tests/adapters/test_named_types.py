"""The model types users ask for by name that the generic adapter serves (no family file): each one gets what a
family file gets beyond the contract suite (which runs on every served type): the cache probe under every simulated
fault, and 2 GRPO steps with one image per prompt and with two."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_adapter
from tests.recipes.helpers import check_two_grpo_steps
from vlm_grpo.adapters.generic.status import generic_types
from vlm_grpo.adapters.registry import is_generic_type
from vlm_grpo.compat.cache_probe import probe_cache
from vlm_grpo.compat.simulated_faults import IMAGE_FAULTS, simulated_fault

ASKED_FOR = ("paligemma", "llama4", "gemma3n", "minicpmv4_6", "molmo2", "kimi_k25")  # issue 38's list
NAMED = [t for t in ASKED_FOR if t in generic_types() and is_generic_type(t)]


def test_the_named_types_are_served():
    assert "paligemma" in NAMED, NAMED


@pytest.mark.parametrize("kind", IMAGE_FAULTS)
@pytest.mark.parametrize("model_type", NAMED)
def test_every_simulated_fault_is_caught(model_type, kind):
    adapter = tiny_adapter(model_type)
    with simulated_fault(adapter, kind):
        report = probe_cache(adapter)
    assert not report.cache_ok, report.table()
    assert report.path_ok(False) or kind == "nan_weights", report.table()


@pytest.mark.parametrize("recipe, options", [("shapes", "{image_size: 56}"),
                                             ("compare_counts", "{image_size: 56, images_per_prompt: 2}")])
@pytest.mark.parametrize("model_type", NAMED)
def test_two_grpo_steps_with_one_and_two_images(model_type, recipe, options, tmp_path):
    check_two_grpo_steps(f"tiny:{model_type}", recipe, options, tmp_path)
