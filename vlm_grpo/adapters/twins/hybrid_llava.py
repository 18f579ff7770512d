"""The LLaVA-classes hybrid's twin and presets: a random SigLIP tower and a random Qwen2 LM assembled as `compose`
assembles real donors, at the tiny twin's sizes or those of the shipped shapes model before training."""

from __future__ import annotations

import torch
from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.seeding import seeded
from vlm_grpo.adapters.twins.qwen2_5_vl import qwen2_lm

# Deliberately not the tiny Qwen2.5-VL's text width (64), so the merger's output differs from the donor's.
TINY_LM = dict(
    hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
    max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
)
TINY_SIGLIP = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
)
# The shipped `pretrained:shapes-tiny` before training (`vlm-grpo sft --model preset:shapes_tiny_init`): a LLaVA
# hybrid sized for 64-px shape counting on CPU; weights come from the seed alone, always float32.
SHAPES_TINY_SIGLIP = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=8,
)
SHAPES_TINY_LM = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, tie_word_embeddings=True,
)


class LlavaHybridTwin:
    """Mixed into LlavaHybridAdapter: the tiny twin's sizes, the presets and `build` (random donors, assembled)."""

    tiny_architecture = Architecture(vision=TINY_SIGLIP, text=TINY_LM)
    presets = {"shapes_tiny_init": Architecture(vision=SHAPES_TINY_SIGLIP, text=SHAPES_TINY_LM)}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        vision_cfg = SiglipVisionConfig(**arch.vision)
        with seeded(seed):
            vision = SiglipVisionModel(vision_cfg).to(dtype).eval()
        lm, tokenizer = qwen2_lm(dict(arch.text), seed + 1, dtype)
        size = {"height": vision_cfg.image_size, "width": vision_cfg.image_size}
        composed = cls.assemble(vision, SiglipImageProcessor(size=size), lm, tokenizer, seed=seed)
        return cls(composed.model, composed.processor, source=f"tiny:{cls.family}")
