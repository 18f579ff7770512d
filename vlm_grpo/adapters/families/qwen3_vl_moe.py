"""Qwen3-VL-MoE: Qwen3-VL's vision side (DeepStack, interleaved M-RoPE, 16-px patches) in front of a
mixture-of-experts language model: every decoder layer's MLP is a router over many small experts, of which each
token uses the top k.

What the MoE changes for training, declared here as data:
- the experts (stored as two 3-D tensors per layer, not Linear modules) and the router form the `experts`
  sub-group of `language`: `freeze: [experts]` and `optim.experts_lr` reach them, and LoRA adapts the expert
  tensors through peft's `target_parameters`;
- the router's load-balancing loss: the forward returns it with `output_router_logits=True`, and the loss adds
  `router_aux_loss_coef` times it (the config's 0.001 unless `loss.router_aux_loss_coef` says otherwise), as TRL
  does (see `VLMAdapter.router_aux_loss_coef`).
"""

from __future__ import annotations

from dataclasses import replace

from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

from vlm_grpo.adapters.families.qwen3_vl import QWEN3_LAYOUT, Qwen3VLAdapter
from vlm_grpo.adapters.twins.qwen3_vl_moe import Qwen3VLMoeTwin

# The routers (`mlp.gate`) and the experts of every sparse layer; dense layers (`mlp_only_layers`) have none.
MOE_LAYOUT = replace(QWEN3_LAYOUT, experts=(r"model\.language_model\.layers\.\d+\.mlp\.experts\.",
                                               r"model\.language_model\.layers\.\d+\.mlp\.gate\."))


class Qwen3VLMoeAdapter(Qwen3VLMoeTwin, Qwen3VLAdapter):
    family = "qwen3_vl_moe"
    model_types = ("qwen3_vl_moe",)
    model_class = Qwen3VLMoeForConditionalGeneration
    config_class = Qwen3VLMoeConfig
    module_layout = MOE_LAYOUT
