"""Qwen3-VL: Qwen2.5-VL's layout (flat patch rows + image_grid_thw, M-RoPE token types) with 16-px patches,
interleaved M-RoPE, and DeepStack: features from early vision layers are added to the hidden states of the
first language layers at the image positions.

DeepStack is why the shared-feature forward differs: the image features of a prompt are not only its merged
patch embeddings but one extra tensor per DeepStack layer. `extra_image_features` keeps them beside the
main features, and `inputs_with_features` hands both to the model as precomputed encoder outputs, so the
model's own forward places them (and builds the positions) exactly as it does from pixels.
"""

from __future__ import annotations

from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.adapters.features import flatten_pooled
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.qwen3_vl import Qwen3VLTwin

QWEN3_LAYOUT = ModuleLayout(
    vision=(r"model\.visual\.(?!merger\.)(?!deepstack_merger_list\.)",),  # no `|`: it would split the README table
    # the merger and the DeepStack mergers both project vision features into the language model's width
    projector=(r"model\.visual\.merger\.", r"model\.visual\.deepstack_merger_list\."),
    language=(r"model\.language_model\.",),
    projector_output=(r"model\.visual\.merger\.linear_fc2\.",),  # the main merger's, not a DeepStack merger's
)


class Qwen3VLAdapter(Qwen3VLTwin, Qwen2_5_VLAdapter):
    family = "qwen3_vl"
    model_types = ("qwen3_vl",)
    model_class = Qwen3VLForConditionalGeneration
    config_class = Qwen3VLConfig
    module_layout = QWEN3_LAYOUT

    # ---------------------------------------------------------------- sharing hooks (DeepStack)
    def extra_image_features(self, encoder_output):
        return tuple(flatten_pooled(layer) for layer in encoder_output.deepstack_features or ())

    def inputs_with_features(self, full_inputs, features, core):
        inputs = {k: v for k, v in full_inputs.items() if k not in self.pixel_keys}
        encoded = {kind: BaseModelOutputWithDeepstackFeatures(
            pooler_output=(feats.flat,), deepstack_features=[(layer,) for layer in feats.extra],
        ) for kind, feats in (("image", features), ("video", features.videos)) if feats is not None and feats.flat.shape[0]}
        if encoded:
            inputs["mm_encoder_outputs"] = encoded
        return inputs
