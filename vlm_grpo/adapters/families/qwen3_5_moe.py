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

from vlm_grpo.adapters.families.qwen3_5 import QWEN3_5_LAYOUT, Qwen3_5Adapter
from vlm_grpo.adapters.twins.qwen3_5_moe import Qwen3_5MoeTwin

# every decoder layer's MLP is an MoE block: router (`gate`), experts, shared expert and its gate
MOE_LAYOUT = replace(QWEN3_5_LAYOUT, experts=(r"model\.language_model\.layers\.\d+\.mlp\.",))


class Qwen3_5MoeAdapter(Qwen3_5MoeTwin, Qwen3_5Adapter):
    family = "qwen3_5_moe"
    model_types = ("qwen3_5_moe",)
    model_class = Qwen3_5MoeForConditionalGeneration
    config_class = Qwen3_5MoeConfig
    module_layout = MOE_LAYOUT
