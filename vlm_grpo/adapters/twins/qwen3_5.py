"""Qwen3.5's twin and presets: Qwen3-VL's builder at a hybrid Gated DeltaNet / full-attention stack's sizes, and
Qwen3.5-0.8B's sizes."""

from __future__ import annotations

import torch

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.twins.qwen3_vl import build_qwen3


def qwen3_5_rope(sections: list[int], theta: float) -> dict:
    """Interleaved M-RoPE on `partial_rotary_factor` of each head: the sections sum to head_dim * factor / 2."""
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": sections, "mrope_interleaved": True,
            "partial_rotary_factor": 0.25}


# 16-px patches merged 2x2 (a 64x64 image -> 4 tokens); 4 decoder layers: linear, linear, linear, full, so both
# kinds of layer and their caches are exercised; heads of 32 with a quarter (8 dims) rotated: sections sum to 4.
TINY = Architecture(
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
              head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=2048,
              tie_word_embeddings=False, rope_parameters=qwen3_5_rope([2, 1, 1], 1e7)),
    image=dict(min_pixels=64 * 64, max_pixels=128 * 128),
)
QWEN3_5_VOCAB = 248320
# Public architecture of Qwen/Qwen3.5-0.8B: 24 layers (18 Gated DeltaNet, 6 full attention), a 12-block vision tower.
QWEN3_5_0_8B = Architecture(
    vision=dict(depth=12, hidden_size=768, intermediate_size=3072, num_heads=12, patch_size=16, spatial_merge_size=2,
                temporal_patch_size=2, out_hidden_size=1024, num_position_embeddings=2304,
                hidden_act="gelu_pytorch_tanh"),
    text=dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
              num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
              max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters=qwen3_5_rope([11, 11, 10], 1e7)),
    image=dict(min_pixels=256 * 256, max_pixels=4096 * 4096),
    vocab_size=QWEN3_5_VOCAB,
    note="Qwen/Qwen3.5-0.8B",
)


class Qwen3_5Twin:
    """Mixed into Qwen3_5Adapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"qwen3_5_0_8b": QWEN3_5_0_8B}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        return build_qwen3(cls, arch, seed, dtype)
