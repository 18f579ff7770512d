"""The Qwen2.5-VL-classes hybrid's twin and presets: built as a native Qwen2.5-VL (Qwen2.5-VL's builder) with the
LLaVA hybrid's tiny LM sizes, and the ViT + 0.5B LM and ViT-heavy benchmark sizes."""

from __future__ import annotations

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.twins.hybrid_llava import TINY_LM
from vlm_grpo.adapters.twins.qwen2_5_vl import (
    BENCH_PIXELS, QWEN_VOCAB, REAL_PIXELS, TINY_PIXELS, TINY_VISION, VISION_3B, qwen_rope
)


def mrope_section(head_dim: int) -> list[int]:
    """Temporal/height/width split of the rotary half-dim; Qwen's 128-dim heads use [16, 24, 24]."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


# Public architecture of Qwen/Qwen2.5-0.5B, its 64-dim heads split for M-RoPE.
TEXT_0_5B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters=qwen_rope(mrope_section(64)),
)


class HybridTwin:
    """Mixed into HybridAdapter: the tiny twin's sizes and the presets (Qwen2.5-VL's twin builds them)."""

    tiny_architecture = Architecture(
        vision=dict(TINY_VISION, out_hidden_size=TINY_LM["hidden_size"]),
        text=dict(TINY_LM, rope_parameters=qwen_rope(mrope_section(16))),
        image=TINY_PIXELS,
    )
    presets = {
        "hybrid_3b_vit_0_5b": Architecture(
            dict(VISION_3B, out_hidden_size=896), TEXT_0_5B, REAL_PIXELS, QWEN_VOCAB,
            note="Qwen/Qwen2.5-VL-3B-Instruct's ViT + Qwen/Qwen2.5-0.5B",
        ),
        # CPU benchmark: a ViT-heavy hybrid, Qwen ViT 8 x 256 (8.7M) + merger (1.2M) -> a 2-layer, 128-wide LM (0.5M)
        "hybrid_vit_heavy": Architecture(
            vision=dict(TINY_VISION, depth=8, hidden_size=256, intermediate_size=1024, num_heads=4, window_size=112,
                        fullatt_block_indexes=[3, 7], out_hidden_size=128),
            text=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, rope_parameters=qwen_rope([4, 6, 6])),
            image=BENCH_PIXELS,
        ),
    }
