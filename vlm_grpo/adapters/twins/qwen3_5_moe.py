"""Qwen3.5-MoE's twin and presets: Qwen3.5's twin with a small mixture of experts and a shared expert, and
Qwen3.5-35B-A3B's sizes (Qwen3-VL's builder makes both)."""

from __future__ import annotations

from dataclasses import replace


from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.twins.qwen3_5 import QWEN3_5_VOCAB, TINY, qwen3_5_rope

# 4 experts of width 32, 2 per token, and a shared expert of width 32, in all four (linear and full) layers.
TINY_MOE = replace(TINY, text=dict(TINY.text, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                   num_experts=4, num_experts_per_tok=2))

# Public architecture of Qwen/Qwen3.5-35B-A3B: 40 layers (30 Gated DeltaNet, 10 full attention), 256 experts of width
# 512 (8 per token) and a shared expert of width 512; Qwen3-VL's 27-block vision tower without DeepStack.
QWEN3_5_35B_A3B = Architecture(
    vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, spatial_merge_size=2,
                temporal_patch_size=2, out_hidden_size=2048, num_position_embeddings=2304,
                hidden_act="gelu_pytorch_tanh"),
    text=dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
              linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
              linear_num_value_heads=32, moe_intermediate_size=512, shared_expert_intermediate_size=512,
              num_experts=256, num_experts_per_tok=8, router_aux_loss_coef=0.001, max_position_embeddings=262144,
              rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=qwen3_5_rope([11, 11, 10], 1e7)),
    image=dict(min_pixels=256 * 256, max_pixels=4096 * 4096),
    vocab_size=QWEN3_5_VOCAB,
    note="Qwen/Qwen3.5-35B-A3B",
)


class Qwen3_5MoeTwin:
    """Mixed into Qwen3_5MoeAdapter: the tiny twin's sizes and the presets (Qwen3.5's twin builds them)."""

    tiny_architecture = TINY_MOE
    presets = {"qwen3_5_35b_a3b": QWEN3_5_35B_A3B}
