"""InternVL's twin and presets: its special and named tokens and ChatML layout on a locally built tokenizer, the
tiling processor, a config from an Architecture, and InternVL3-1B-hf's sizes."""

from __future__ import annotations

import torch
from transformers import GotOcr2ImageProcessor, InternVLConfig, InternVLProcessor, InternVLVideoProcessor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

INTERNVL_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>", "<quad>",
    "</quad>", "<ref>", "</ref>", "<box>", "</box>",
]
# The processor finds these through the tokenizer's named special tokens.
INTERNVL_NAMED_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
# InternVL3-hf's ChatML layout, no default system turn. An image part is one <IMG_CONTEXT>, which
# the processor expands to <img> + <IMG_CONTEXT> * image_seq_length * tiles + </img>.
INTERNVL_CHAT_TEMPLATE = chatml_template("<IMG_CONTEXT>\n", default_system=None, video_part="<video>\n")

def tokens_per_tile(image_size: int, patch_size: int, downsample_ratio: float) -> int:
    """Tokens one tile gives: its patch grid, shrunk by pixel shuffle in each direction."""
    return int(image_size // patch_size * downsample_ratio) ** 2


# 56-px tiles, 14-px patches: a 4x4 patch grid -> pixel shuffle 0.5 -> 2x2 = 4 tokens per tile.
TINY = Architecture(
    vision=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=56,
                patch_size=14, attention_bias=True, layer_scale_init_value=0.1),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
              # Untied in the tiny twin so that the `head` module group is not empty (freeze tests need it).
              tie_word_embeddings=False),
    image=dict(tile=56, max_patches=4, downsample_ratio=0.5),
)
INTERNVL_VOCAB = 151674
# Public architecture of OpenGVLab/InternVL3-1B-hf: InternViT-300M-448px + Qwen2.5-0.5B. It unties lm_head from
# the embeddings (tie_word_embeddings: false), unlike the Qwen2.5-0.5B it started from: ~0.94B parameters.
INTERNVL3_1B = Architecture(
    vision=dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, image_size=448,
                patch_size=14, hidden_act="gelu", attention_bias=True, use_qk_norm=False, norm_type="layer_norm",
                layer_norm_eps=1e-6, layer_scale_init_value=0.1, use_mean_pooling=True,
                use_absolute_position_embeddings=True),
    text=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu",
              tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    image=dict(tile=448, max_patches=12, downsample_ratio=0.5),
    vocab_size=INTERNVL_VOCAB,
    note="OpenGVLab/InternVL3-1B-hf",
)


class InternVLTwin:
    """Mixed into InternVLAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"internvl3_1b": INTERNVL3_1B}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(
            INTERNVL_SPECIAL_TOKENS, chat_template=INTERNVL_CHAT_TEMPLATE, eos_token="<|im_end|>",
            pad_token="<|endoftext|>", extra_special_tokens=INTERNVL_NAMED_TOKENS,
        )
        ratio = arch.image["downsample_ratio"]
        text = {
            "model_type": "qwen2", "vocab_size": arch.vocab_size or len(tokenizer), "bos_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id, **arch.text,
        }
        config = InternVLConfig(
            vision_config=dict(arch.vision), text_config=text,
            image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
            image_seq_length=tokens_per_tile(arch.vision["image_size"], arch.vision["patch_size"], ratio),
            downsample_ratio=ratio, tie_word_embeddings=text.get("tie_word_embeddings", False),
        )
        size = {"height": arch.image["tile"], "width": arch.image["tile"]}
        processor = InternVLProcessor(
            image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=True, min_patches=1,
                                                  max_patches=arch.image["max_patches"]),
            tokenizer=tokenizer,
            video_processor=InternVLVideoProcessor(size=size),
            image_seq_length=config.image_seq_length,
            chat_template=tokenizer.chat_template,
        )
        return cls(seeded_model(cls.model_class, config, seed, dtype), processor, source=f"tiny:{cls.family}")
