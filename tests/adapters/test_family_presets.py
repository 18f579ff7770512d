"""Real-size presets of the newer families build (on the meta device: no weights allocated) with the parameter
count their public model cards state, every module group filled; a mixture-of-experts one has its experts."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo.adapters.registry import all_presets

# preset -> parameters on the model card (the checkpoint holds no module the preset leaves out)
CARD_PARAMETERS = {
    "qwen3_vl_30b_a3b": 31.1e9,  # Qwen/Qwen3-VL-30B-A3B-Instruct
    "glm4_1v_9b": 10.3e9,  # zai-org/GLM-4.1V-9B-Thinking
    "llava_onevision_0_5b": 0.894e9,  # llava-hf/llava-onevision-qwen2-0.5b-ov-hf
    "lfm2_vl_450m": 0.451e9,  # LiquidAI/LFM2-VL-450M
}


@pytest.mark.parametrize("name", sorted(CARD_PARAMETERS))
def test_preset_has_the_model_cards_size(name):
    with torch.device("meta"):
        adapter = all_presets()[name].preset(name)
    assert adapter.model.dtype == torch.bfloat16
    n_params = sum(p.numel() for p in adapter.model.parameters())
    assert abs(n_params / CARD_PARAMETERS[name] - 1) < 0.01, n_params
    groups = adapter.module_groups()
    assert all(groups[g] for g in ("vision", "projector", "language"))
    experts = [n for n, _ in adapter.model.named_parameters() if adapter.training_group_of(n) == "experts"]
    assert bool(experts) == ("a3b" in name)  # the MoE preset's routers and experts, and only there
