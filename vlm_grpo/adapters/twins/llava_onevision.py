"""LLaVA-OneVision's twin and presets: Qwen's tokens with <image>/<video> on a locally built tokenizer, the anyres
processor, a config from an Architecture, and llava-onevision-qwen2-0.5b-ov-hf's sizes."""

from __future__ import annotations

import torch
from transformers import (
    LlavaOnevisionConfig, LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor
)

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer
from vlm_grpo.adapters.twins.qwen2_5_vl import QWEN_SPECIAL_TOKENS

SPECIAL_TOKENS = [*QWEN_SPECIAL_TOKENS, "<image>", "<video>"]
# Qwen2's ChatML with its default system turn; an image part is `<image>` and a line break.
CHAT_TEMPLATE = chatml_template("<image>\n")


def pinpoints(tile: int, most: int) -> list[list[int]]:
    """Every grid of up to `most` x `most` tiles, as (height, width) in pixels (OneVision's own list, at 384 px)."""
    return [[tile * r, tile * c] for r in range(1, most + 1) for c in range(1, most + 1)]


# 16-px tiles of 8-px patches: 2x2 tokens a tile; grids up to 2x2 tiles. A 112x56 image alone is a base tile plus a
# 1x2-tile grid: 4 + 2 x (4 + 1) tokens.
TINY = Architecture(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                patch_size=8, vision_use_head=False),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=2048, tie_word_embeddings=False),
    image=dict(image_grid_pinpoints=pinpoints(16, 2)),
)
# Public architecture of llava-hf/llava-onevision-qwen2-0.5b-ov-hf: SigLIP-So400m (26 layers) at 384 px, Qwen2-0.5B.
ONEVISION_0_5B = Architecture(
    vision=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=26, num_attention_heads=16, image_size=384,
                patch_size=14, vision_use_head=False),
    text=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
              tie_word_embeddings=True),
    image=dict(image_grid_pinpoints=pinpoints(384, 6)),
    vocab_size=151936,
    note="llava-hf/llava-onevision-qwen2-0.5b-ov-hf",
)


def without_unused_norm(model):
    """The model reads its image features from the tower's last layer *before* SigLIP's final layer norm, so that
    norm's weights never get a gradient (training reports them as trainable yet unchanged; DDP refuses unused
    parameters). It is replaced by an identity: the features are exactly the same."""
    model.model.vision_tower.post_layernorm = torch.nn.Identity()
    return model


class LlavaOnevisionTwin:
    """Mixed into LlavaOnevisionAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"llava_onevision_0_5b": ONEVISION_0_5B}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE, eos_token="<|im_end|>",
                                    pad_token="<|endoftext|>")
        ids = tokenizer.convert_tokens_to_ids
        text = {"model_type": "qwen2", "vocab_size": arch.vocab_size or len(tokenizer),
                "pad_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"), **arch.text}
        grid = arch.image["image_grid_pinpoints"]
        config = LlavaOnevisionConfig(
            text_config=text, vision_config={"model_type": "siglip_vision_model", **arch.vision},
            image_token_index=ids("<image>"), video_token_index=ids("<video>"), image_grid_pinpoints=grid,
            tie_word_embeddings=text["tie_word_embeddings"],
        )
        side = arch.vision["image_size"]
        size = {"height": side, "width": side}
        processor = LlavaOnevisionProcessor(
            image_processor=LlavaOnevisionImageProcessor(size=size, image_grid_pinpoints=grid),
            video_processor=LlavaOnevisionVideoProcessor(size=size), tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
            num_image_tokens=(side // arch.vision["patch_size"]) ** 2, vision_feature_select_strategy="full",
        )
        model = seeded_model(cls.model_class, config, seed, dtype)
        model.generation_config.pad_token_id = ids("<|endoftext|>")
        return cls(without_unused_norm(model), processor, source=f"tiny:{cls.family}")
