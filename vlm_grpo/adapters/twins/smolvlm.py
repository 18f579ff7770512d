"""SmolVLM's twin and presets: Idefics3's tiled twin with SmolLM2's tokens and SmolVLM's classes (video too), and
SmolVLM-256M-Instruct's sizes."""

from __future__ import annotations

from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.twins.idefics3 import IMAGE_LAYOUT_TOKENS, TiledSpec, TiledTwin

# Public architecture of HuggingFaceTB/SmolVLM-256M-Instruct (SigLIP-base/16 at 512 px + SmolLM2-135M):
# (512/16)^2 / 4^2 = 64 tokens per tile.
SMOLVLM_256M = Architecture(
    vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=512,
                patch_size=16),
    text=dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    image=dict(scale_factor=4, longest_edge=2048, max_image_size=512),
    vocab_size=49280,
    note="HuggingFaceTB/SmolVLM-256M-Instruct",
)


class SmolVLMTwin(TiledTwin):
    """Mixed into SmolVLMAdapter: SmolVLM's classes and tokens for TiledTwin's `build`, and the presets."""

    presets = {"smolvlm_256m": SMOLVLM_256M}
    spec = TiledSpec(
        config_cls=SmolVLMConfig,
        processor_cls=SmolVLMProcessor,
        image_processor_cls=SmolVLMImageProcessor,
        # SmolLM2's first ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 (the pad token).
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", *IMAGE_LAYOUT_TOKENS],
        prefix="<|im_start|>",
        pad_token="<|im_end|>",
        video_processor_cls=SmolVLMVideoProcessor,
    )
