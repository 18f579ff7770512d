"""Qwen3.5-MoE: Qwen3.5 (its vision side, the hybrid Gated DeltaNet / full-attention stack) with a mixture-of-experts
block in every layer: a router over many small experts (3-D weight tensors), of which each token uses the top k,
plus a shared expert every token passes through, scaled by its own sigmoid gate.

The MoE training parts are declared here as data, as for Qwen3-VL-MoE: the routers, routed experts and shared
expert form the `experts` sub-group of `language`, LoRA reaches the expert tensors through peft's
`target_parameters`, and the routers' load-balancing loss joins the loss with `router_aux_loss_coef`.
"""

from __future__ import annotations

from dataclasses import replace

from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.families.qwen3_5 import QWEN3_5_LAYOUT, QWEN3_5_VOCAB, TINY, Qwen3_5Adapter, qwen3_5_rope

# every decoder layer's MLP is an MoE block: router (`gate`), experts, shared expert and its gate
MOE_LAYOUT = replace(QWEN3_5_LAYOUT, experts=(r"model\.language_model\.layers\.\d+\.mlp\.",))

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


class Qwen3_5MoeAdapter(Qwen3_5Adapter):
    family = "qwen3_5_moe"
    model_types = ("qwen3_5_moe",)
    model_class = Qwen3_5MoeForConditionalGeneration
    config_class = Qwen3_5MoeConfig
    module_layout = MOE_LAYOUT
    tiny_architecture = TINY_MOE
    presets = {"qwen3_5_35b_a3b": QWEN3_5_35B_A3B}
