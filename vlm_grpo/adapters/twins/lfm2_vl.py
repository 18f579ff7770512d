"""LFM2-VL's twin and presets: its ChatML and tile markers on a locally built tokenizer, the processor, a config
from an Architecture, and the LFM2-VL-450M/1.6B sizes."""

from __future__ import annotations

import torch
from transformers import Lfm2VlConfig, Lfm2VlImageProcessor, Lfm2VlProcessor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

TILE_MARKERS = [f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)]  # the twin's up-to-4x4 grids
SPECIAL_TOKENS = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>",
                  "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>", *TILE_MARKERS]
# LFM2's ChatML, opened by <|startoftext|>; an image part is <image> (the processor expands it).
CHAT_TEMPLATE = "{{- '<|startoftext|>' -}}" + chatml_template("<image>", default_system=None)


def lfm2_layers(count: int, attention: list[int]) -> list[str]:
    return ["full_attention" if i in attention else "conv" for i in range(count)]


# 8-px patches, 32-px tiles (2x2 tokens each), 4-8 tokens for an image kept whole: a 56x56 image stays one tile,
# a 112x56 one becomes 2 tiles + a 2x4-token thumbnail.
TINY = Architecture(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                num_patches=16, vision_use_head=False),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=2048, block_auto_adjust_ff_dim=False, layer_types=lfm2_layers(3, [1]),
              tie_word_embeddings=False),
    image=dict(projector_hidden_size=64, encoder_patch_size=8, tile_size=32, min_image_tokens=4, max_image_tokens=8,
               min_tiles=2, max_tiles=4),
)
LFM2_VOCAB = 65536


def lfm2_vl(text_hidden: int, heads: int, ffn: int, vision: tuple[int, int, int, int], note: str) -> Architecture:
    """The public LFM2-VL layout: 16 LFM2 layers (attention at 2, 5, 8, 10, 12, 14), a SigLIP2 NaFlex tower of
    16-px patches, 512-px tiles, 64-256 tokens per tile."""
    hidden, intermediate, layers, vision_heads = vision
    return Architecture(
        vision=dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                    num_attention_heads=vision_heads, patch_size=16, num_patches=256, vision_use_head=False),
        text=dict(hidden_size=text_hidden, intermediate_size=ffn, num_hidden_layers=16, num_attention_heads=heads,
                  num_key_value_heads=8, max_position_embeddings=128000, block_multiple_of=256,
                  block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True, conv_L_cache=3,
                  layer_types=lfm2_layers(16, [2, 5, 8, 10, 12, 14]), tie_word_embeddings=True),
        image=dict(projector_hidden_size=2048, projector_use_layernorm=False, encoder_patch_size=16, tile_size=512,
                   min_image_tokens=64, max_image_tokens=256, min_tiles=2, max_tiles=10),
        vocab_size=LFM2_VOCAB, note=note,
    )


class Lfm2VlTwin:
    """Mixed into Lfm2VlAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"lfm2_vl_450m": lfm2_vl(1024, 16, 6656, (768, 3072, 12, 12), "LiquidAI/LFM2-VL-450M"),
               "lfm2_vl_1_6b": lfm2_vl(2048, 32, 12288, (1152, 4304, 27, 16), "LiquidAI/LFM2-VL-1.6B")}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE, eos_token="<|im_end|>",
                                    pad_token="<|pad|>", bos_token="<|startoftext|>")
        ids = tokenizer.convert_tokens_to_ids
        text = {"vocab_size": arch.vocab_size or len(tokenizer), "pad_token_id": ids("<|pad|>"),
                "bos_token_id": ids("<|startoftext|>"), "eos_token_id": ids("<|im_end|>"), **arch.text}
        image = dict(arch.image)
        config = Lfm2VlConfig(
            text_config=text, vision_config=dict(arch.vision), image_token_id=ids("<image>"),
            projector_hidden_size=image.pop("projector_hidden_size"),
            projector_use_layernorm=image.pop("projector_use_layernorm", True),
            tie_word_embeddings=text["tie_word_embeddings"],
        )
        processor = Lfm2VlProcessor(image_processor=Lfm2VlImageProcessor(**image), tokenizer=tokenizer,
                                    chat_template=CHAT_TEMPLATE)
        model = seeded_model(cls.model_class, config, seed, dtype)
        model.generation_config.pad_token_id = ids("<|pad|>")
        return cls(model, processor, source=f"tiny:{cls.family}")
