"""Qwen3-VL-MoE's twin and presets: Qwen3-VL's twin with a small mixture of experts, and Qwen3-VL-30B-A3B's sizes
(Qwen3-VL's builder makes both)."""

from __future__ import annotations

from dataclasses import replace


from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.twins.qwen3_vl import QWEN3_VOCAB, TINY, qwen3_rope

# 4 experts of width 32, 2 per token: small, but routing still chooses (and so can be unbalanced).
TINY_MOE = replace(TINY, text=dict(TINY.text, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                   decoder_sparse_step=1, tie_word_embeddings=False))

# Public architecture of Qwen/Qwen3-VL-30B-A3B-Instruct: 48 layers of 128 experts (8 active, width 768) and a
# 27-block 1152-wide vision tower with DeepStack taps after blocks 8, 16 and 24.
QWEN3_VL_30B_A3B = Architecture(
    vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, spatial_merge_size=2,
                temporal_patch_size=2, out_hidden_size=2048, num_position_embeddings=2304,
                deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh"),
    text=dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
              num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
              decoder_sparse_step=1, max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=False,
              router_aux_loss_coef=0.001, rope_parameters=qwen3_rope([24, 20, 20], 5e6)),
    image=dict(min_pixels=256 * 256, max_pixels=4096 * 4096),
    vocab_size=QWEN3_VOCAB,
    note="Qwen/Qwen3-VL-30B-A3B-Instruct",
)


class Qwen3VLMoeTwin:
    """Mixed into Qwen3VLMoeAdapter: the tiny twin's sizes and the presets (Qwen3-VL's twin builds them)."""

    tiny_architecture = TINY_MOE
    presets = {"qwen3_vl_30b_a3b": QWEN3_VL_30B_A3B}
