"""Idefics3's twin (and, through TiledTwin, SmolVLM's): the tiled layout's tokens on a locally built tokenizer, the
processor, and a config from an Architecture; TiledSpec holds what differs between the two families."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from transformers import Idefics3Config, Idefics3ImageProcessor, Idefics3Processor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.chat_templates import user_assistant_template
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

FAKE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
GLOBAL_TOKEN = "<global-img>"
END_OF_UTTERANCE = "<end_of_utterance>"
ROW_COL_TOKENS = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
IMAGE_LAYOUT_TOKENS = [FAKE_TOKEN, IMAGE_TOKEN, GLOBAL_TOKEN, END_OF_UTTERANCE, *ROW_COL_TOKENS]


class TiledSpec(NamedTuple):
    """What differs between Idefics3 and SmolVLM when building a twin or preset."""

    config_cls: type
    processor_cls: type
    image_processor_cls: type
    special_tokens: list[str]
    prefix: str  # opens every conversation; also the BOS id
    pad_token: str
    video_processor_cls: type | None = None


# 32-px tiles of 8-px patches, pixel shuffle 2: (32/8)^2 / 2^2 = 4 tokens per tile.
TINY = Architecture(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                patch_size=8),
    text=dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5),
    image=dict(scale_factor=2, longest_edge=64, max_image_size=32),
)


class TiledTwin:
    """Mixed into TiledImageAdapter: the tiny twin's sizes and `build`, from the family's `spec`."""

    spec: ClassVar[TiledSpec]
    tiny_architecture = TINY

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        spec, image = cls.spec, arch.image
        tokenizer = build_tokenizer(spec.special_tokens, chat_template=user_assistant_template(spec.prefix),
                                    eos_token=END_OF_UTTERANCE, pad_token=spec.pad_token)
        seq_len = (arch.vision["image_size"] // arch.vision["patch_size"]) ** 2 // image["scale_factor"] ** 2
        image_processor = spec.image_processor_cls(
            size={"longest_edge": image["longest_edge"]}, max_image_size={"longest_edge": image["max_image_size"]},
            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        )
        # Frames are resized to one tile (never split), the tile the vision tower takes.
        frame = {"longest_edge": image["max_image_size"]}
        extra = {"video_processor": spec.video_processor_cls(size=frame, max_image_size=frame, image_mean=[0.5] * 3,
                                                             image_std=[0.5] * 3)} if spec.video_processor_cls else {}
        processor = spec.processor_cls(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=seq_len,
                                       chat_template=tokenizer.chat_template, **extra)
        ids = {"bos_token_id": tokenizer.convert_tokens_to_ids(spec.prefix), "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
        config = spec.config_cls(
            text_config={"vocab_size": arch.vocab_size or len(tokenizer), **ids, **arch.text},
            vision_config=dict(arch.vision), scale_factor=image["scale_factor"],
            image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
            tie_word_embeddings=False,  # untied in the public checkpoints (SmolVLM-256M counts 256.5M with lm_head)
            pad_token_id=tokenizer.pad_token_id,
        )
        model = seeded_model(cls.model_class, config, seed, dtype)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        return cls(model, processor, source=f"tiny:{cls.family}")


class Idefics3Twin(TiledTwin):
    """Mixed into Idefics3Adapter: Idefics3's classes and tokens for TiledTwin's `build`."""

    spec = TiledSpec(
        config_cls=Idefics3Config,
        processor_cls=Idefics3Processor,
        image_processor_cls=Idefics3ImageProcessor,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>", *IMAGE_LAYOUT_TOKENS],
        prefix="<|begin_of_text|>",
        pad_token="<|end_of_text|>",
    )
