"""Qwen3-VL: Qwen2.5-VL's layout (flat patch rows + image_grid_thw, M-RoPE token types) with 16-px patches,
interleaved M-RoPE, and DeepStack: features from early vision layers are added to the hidden states of the
first language layers at the image positions.

DeepStack is why the shared-feature forward differs: the image features of a prompt are not only its merged
patch embeddings but one extra tensor per DeepStack layer. `extra_image_features` keeps them beside the
main features, and `inputs_with_features` hands both to the model as precomputed encoder outputs, so the
model's own forward places them (and builds the positions) exactly as it does from pixels.
"""

from __future__ import annotations

import torch
from transformers import (
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.families.qwen2_5_vl import (
    QWEN_VIDEO_PART, Qwen2_5_VLAdapter, qwen_config, qwen_processor, qwen_tokenizer,
)
from vlm_grpo.adapters.features import flatten_pooled
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.seeding import seeded_model

# Qwen3-VL's ChatML without a default system turn; an image part is <|vision_start|><|image_pad|><|vision_end|>,
# a video part the same with <|video_pad|> (the processor writes a <t seconds> timestamp before each temporal patch).
QWEN3_CHAT_TEMPLATE = chatml_template("<|vision_start|><|image_pad|><|vision_end|>", default_system=None,
                                      video_part=QWEN_VIDEO_PART)
QWEN3_LAYOUT = ModuleLayout(
    vision=(r"model\.visual\.(?!merger\.)(?!deepstack_merger_list\.)",),  # no `|`: it would split the README table
    # the merger and the DeepStack mergers both project vision features into the language model's width
    projector=(r"model\.visual\.merger\.", r"model\.visual\.deepstack_merger_list\."),
    language=(r"model\.language_model\.",),
    projector_output=(r"model\.visual\.merger\.linear_fc2\.",),  # the main merger's, not a DeepStack merger's
)


def qwen3_rope(sections: list[int], theta: float) -> dict:
    """Interleaved M-RoPE: temporal/height/width sections of the rotary half-dim (they sum to head_dim / 2)."""
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": sections, "mrope_interleaved": True}


# 16-px patches merged 2x2: a 64x64 image is a 4x4 patch grid -> 4 tokens.
TINY = Architecture(
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0]),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=2048, rope_parameters=qwen3_rope([4, 2, 2], 5e6)),
    image=dict(min_pixels=64 * 64, max_pixels=128 * 128),
)
QWEN3_VOCAB = 151936
# The vision tower both public checkpoints share: 24 blocks of 1024, DeepStack taps after blocks 5, 11 and 17.
VISION_2B_4B = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                    deepstack_visual_indexes=[5, 11, 17], hidden_act="gelu_pytorch_tanh")


def text_2b_4b(**sizes) -> dict:
    """The language model settings both public checkpoints share, with a checkpoint's sizes (a fresh rope dict each)."""
    return dict(num_key_value_heads=8, head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
                tie_word_embeddings=True, rope_parameters=qwen3_rope([24, 20, 20], 5e6), **sizes)


REAL_IMAGE = dict(min_pixels=256 * 256, max_pixels=4096 * 4096)  # the checkpoints' preprocessor_config.json
PRESETS = {
    "qwen3_vl_2b": Architecture(
        vision=dict(VISION_2B_4B, out_hidden_size=2048),
        text=text_2b_4b(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16),
        image=REAL_IMAGE, vocab_size=QWEN3_VOCAB, note="Qwen/Qwen3-VL-2B-Instruct",
    ),
    "qwen3_vl_4b": Architecture(
        vision=dict(VISION_2B_4B, out_hidden_size=2560),
        text=text_2b_4b(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32),
        image=REAL_IMAGE, vocab_size=QWEN3_VOCAB, note="Qwen/Qwen3-VL-4B-Instruct",
    ),
}


def build_qwen3(cls, arch, seed: int = 0, dtype=torch.float32):
    """A Qwen3-generation twin or preset of `cls` (Qwen3-VL, Qwen3.5 and their MoE): Qwen3's chat template and
    processors (patch size from the architecture), the model seeded."""
    tokenizer = qwen_tokenizer(chat_template=QWEN3_CHAT_TEMPLATE)
    patch = arch.vision["patch_size"]
    processor = qwen_processor(
        tokenizer, arch.image["min_pixels"], arch.image["max_pixels"], Qwen3VLProcessor,
        video_processor_cls=Qwen3VLVideoProcessor, video_options=dict(patch_size=patch),
        image_options=dict(patch_size=patch, image_mean=[0.5] * 3, image_std=[0.5] * 3),
    )
    model = seeded_model(cls.model_class, qwen_config(cls.config_class, tokenizer, arch), seed, dtype)
    return cls(model, processor, source=f"tiny:{cls.family}")


class Qwen3VLAdapter(Qwen2_5_VLAdapter):
    family = "qwen3_vl"
    model_types = ("qwen3_vl",)
    model_class = Qwen3VLForConditionalGeneration
    config_class = Qwen3VLConfig
    module_layout = QWEN3_LAYOUT
    tiny_architecture = TINY
    presets = PRESETS

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        return build_qwen3(cls, arch, seed, dtype)

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
