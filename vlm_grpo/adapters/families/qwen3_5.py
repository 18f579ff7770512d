"""Qwen3.5: Qwen3-VL's vision side without DeepStack (one merger) and a hybrid language model: three of every
four decoder layers are Gated DeltaNet linear attention (a causal convolution and a recurrent state instead of
keys and values), the fourth full attention with a gated output and rotary embedding on a quarter of each head.

The recurrent layers are why this is not the Qwen3-VL file with other sizes: their state is not a KV cache.
Left padding is masked out of the recurrence by the model itself (padded positions contribute nothing), and the
cache transformers builds for the hybrid stack carries the recurrent and convolution states beside the keys and
values of the full-attention layers, so prefix sharing and teacher-forced scoring go through the same hooks as
Qwen3-VL. Without DeepStack, image features are only the merged patch embeddings: the default feature placement
(token embeddings with the features at the image tokens) plus the M-RoPE positions of the rope index.
"""

from __future__ import annotations

from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.qwen3_5 import Qwen3_5Twin

QWEN3_5_LAYOUT = ModuleLayout(
    vision=(r"model\.visual\.(?!merger\.)",),
    projector=(r"model\.visual\.merger\.",),
    language=(r"model\.language_model\.",),
)


class Qwen3_5Adapter(Qwen3_5Twin, Qwen2_5_VLAdapter):
    family = "qwen3_5"
    model_types = ("qwen3_5",)
    model_class = Qwen3_5ForConditionalGeneration
    config_class = Qwen3_5Config
    module_layout = QWEN3_5_LAYOUT
