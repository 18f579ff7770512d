"""SmolVLM: Idefics3's tiled layout with SmolLM2 text, SigLIP vision and a video-processor slot."""

from __future__ import annotations

import torch
from transformers import (
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessor,
    SmolVLMProcessor,
    SmolVLMVideoProcessor,
)

from vlm_grpo.adapters.idefics3 import (
    IMAGE_LAYOUT_TOKENS,
    TINY_IMAGE,
    TINY_TEXT,
    TINY_VISION,
    TiledImageAdapter,
    TiledSpec,
    build_tiled_adapter,
)
from vlm_grpo.adapters.registry import register

SMOLVLM_SPEC = TiledSpec(
    config_cls=SmolVLMConfig,
    processor_cls=SmolVLMProcessor,
    image_processor_cls=SmolVLMImageProcessor,
    # SmolLM2's first ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (the pad token).
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", *IMAGE_LAYOUT_TOKENS],
    prefix="<|im_start|>",
    pad_token="<|im_end|>",
    video_processor=SmolVLMVideoProcessor,
)

# Public architecture of HuggingFaceTB/SmolVLM-256M-Instruct (SigLIP-base/16 at 512 px + SmolLM2-135M).
VISION_256M = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    image_size=512, patch_size=16,
)
TEXT_256M = dict(
    model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
)
IMAGE_256M = dict(scale_factor=4, longest_edge=2048, max_image_size=512)  # (512/16)^2 / 4^2 = 64 tokens per tile
VOCAB_256M = 49280


class SmolVLMAdapter(TiledImageAdapter):
    family = "smolvlm"
    model_types = ("smolvlm",)
    model_class = SmolVLMForConditionalGeneration
    spec = SMOLVLM_SPEC
    presets = {
        "smolvlm_256m": lambda seed=0, dtype=torch.bfloat16: build_tiled_adapter(
            SmolVLMAdapter, SMOLVLM_SPEC, vision=VISION_256M, text=TEXT_256M, image=IMAGE_256M, seed=seed,
            dtype=dtype, vocab_size=VOCAB_256M,
        )
    }

    @classmethod
    def tiny(cls, seed: int = 0) -> "SmolVLMAdapter":
        return build_tiled_adapter(cls, cls.spec, vision=TINY_VISION, text=TINY_TEXT, image=TINY_IMAGE, seed=seed)


register(SmolVLMAdapter)
