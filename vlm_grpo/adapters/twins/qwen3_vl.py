"""Qwen3-VL's twin and presets (and the builder of every Qwen3-generation twin: Qwen3.5 and the MoE families): Qwen3's
chat template over Qwen's tokens, its processors with the architecture's patch size, and the 2B/4B sizes."""

from __future__ import annotations

import torch
from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.twins.qwen2_5_vl import QWEN_VIDEO_PART, qwen_config, qwen_processor, qwen_tokenizer

# Qwen3-VL's ChatML without a default system turn; an image part is <|vision_start|><|image_pad|><|vision_end|>,
# a video part the same with <|video_pad|> (the processor writes a <t seconds> timestamp before each temporal patch).
QWEN3_CHAT_TEMPLATE = chatml_template("<|vision_start|><|image_pad|><|vision_end|>", default_system=None,
                                      video_part=QWEN_VIDEO_PART)

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


class Qwen3VLTwin:
    """Mixed into Qwen3VLAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = PRESETS

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        return build_qwen3(cls, arch, seed, dtype)
