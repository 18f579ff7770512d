"""Qwen2.5-VL's twin and presets: its special tokens and chat template on a locally built tokenizer, the processor,
the config from an Architecture, and the sizes (the tiny twin's, the public 3B's, the CPU benchmarks')."""

from __future__ import annotations

import torch
from transformers import (
    Qwen2_5_VLProcessor, Qwen2Config, Qwen2ForCausalLM, Qwen2VLImageProcessor, Qwen2VLVideoProcessor
)

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.seeding import seeded, seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]
# Qwen's ChatML layout with a default system turn; each image part is
# <|vision_start|><|image_pad|><|vision_end|>, each video part the same with <|video_pad|> (the processor expands it).
QWEN_VIDEO_PART = "<|vision_start|><|video_pad|><|vision_end|>"
QWEN_CHAT_TEMPLATE = chatml_template("<|vision_start|><|image_pad|><|vision_end|>", video_part=QWEN_VIDEO_PART)


def qwen_tokenizer(special_tokens=QWEN_SPECIAL_TOKENS, chat_template=QWEN_CHAT_TEMPLATE):
    return build_tokenizer(special_tokens, chat_template=chat_template, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def qwen_processor(tokenizer, min_pixels: int, max_pixels: int, processor_cls=Qwen2_5_VLProcessor,
                   image_processor_cls=Qwen2VLImageProcessor, video_processor_cls=Qwen2VLVideoProcessor,
                   image_options: dict | None = None, video_options: dict | None = None):
    """The family's processor over `tokenizer`; `*_options`: further image/video processor arguments (patch size,
    normalisation) for families that differ from Qwen2.5-VL's."""
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    return processor_cls(
        image_processor=image_processor_cls(size=size, **(image_options or {})),
        tokenizer=tokenizer,
        # cap_pixels_per_frame: qwen-vl-utils' budget (each frame an even share of the video's pixel budget)
        video_processor=video_processor_cls(size=size, cap_pixels_per_frame=True, **(video_options or {})),
        chat_template=tokenizer.chat_template,
    )


def qwen_token_ids(tokenizer) -> dict[str, int]:
    ids = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
    }


def qwen_config(config_cls, tokenizer, arch: Architecture):
    text = {
        "vocab_size": arch.vocab_size or len(tokenizer),
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **arch.text,
    }
    return config_cls(
        text_config=text, vision_config=dict(arch.vision), tie_word_embeddings=text.get("tie_word_embeddings", False),
        **qwen_token_ids(tokenizer),
    )


def qwen_rope(sections: list[int], theta: float = 1e6) -> dict:
    """M-RoPE: the rotary half-dim split into temporal/height/width sections (they sum to head_dim / 2)."""
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": sections}


def qwen2_lm(text: dict, seed: int, dtype: torch.dtype = torch.float32) -> tuple[Qwen2ForCausalLM, object]:
    """A random-weight Qwen2 causal LM and its tiny tokenizer: the language donor of the hybrids' twins."""
    tokenizer = qwen_tokenizer()
    text = {"tie_word_embeddings": False, **text}
    config = Qwen2Config(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **text,
    )
    with seeded(seed):
        return Qwen2ForCausalLM(config).to(dtype).eval(), tokenizer


TINY_VISION = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
    temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1], out_hidden_size=64,
)
TINY_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=2048, rope_parameters=qwen_rope([2, 3, 3]),
)
TINY_PIXELS = {"min_pixels": 56 * 56, "max_pixels": 112 * 112}  # a 56x56 image: 16 patches -> 4 tokens
BENCH_PIXELS = {"min_pixels": 224 * 224, "max_pixels": 224 * 224}  # 224x224: 16x16 patches -> 64 tokens
QWEN_VOCAB = 151936
# Public architecture of Qwen/Qwen2.5-VL-3B-Instruct.
VISION_3B = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14, spatial_merge_size=2,
    temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31], out_hidden_size=2048,
)
TEXT_3B = dict(
    hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
    max_position_embeddings=128000, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters=qwen_rope([16, 24, 24]),
)
REAL_PIXELS = {"min_pixels": 256 * 28 * 28, "max_pixels": 1280 * 28 * 28}


class Qwen2_5_VLTwin:
    """Mixed into Qwen2_5_VLAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = Architecture(vision=TINY_VISION, text=TINY_TEXT, image=TINY_PIXELS)
    presets = {
        "qwen2_5_vl_3b": Architecture(VISION_3B, TEXT_3B, REAL_PIXELS, QWEN_VOCAB, note="Qwen/Qwen2.5-VL-3B-Instruct"),
        # CPU benchmark: ViT 4 x 192 (2.0M) + merger (0.8M) -> LM 4 x 256 (3.2M), 224-px images -> 64 tokens
        "qwen2_5_vl_small": Architecture(
            vision=dict(TINY_VISION, depth=4, hidden_size=192, intermediate_size=512, num_heads=3, window_size=112,
                        fullatt_block_indexes=[3], out_hidden_size=256),
            text=dict(TINY_TEXT, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                      max_position_embeddings=4096, rope_parameters=qwen_rope([4, 6, 6])),
            image=BENCH_PIXELS,
        ),
        # vLLM on a CPU (tests, bench): its CPU attention needs head_dim >= 32; the tiny twin's, 128 wide, 4 heads
        "qwen2_5_vl_vllm_tiny": Architecture(
            vision=dict(TINY_VISION, out_hidden_size=128),
            text=dict(TINY_TEXT, hidden_size=128, intermediate_size=256, rope_parameters=qwen_rope([4, 6, 6])),
            image=TINY_PIXELS,
        ),
        # CPU memory benchmark: the tiny twin's sizes with Qwen's 151,936-token vocabulary, so the logits dominate
        "qwen2_5_vl_wide_vocab": Architecture(TINY_VISION, TINY_TEXT, TINY_PIXELS, QWEN_VOCAB),
        # CPU benchmark, a real architecture at reduced depth: 0.54B parameters (0.31B the tied embedding), 64 tokens
        "qwen2_5_vl_3b_2_layers": Architecture(
            dict(VISION_3B, depth=2, fullatt_block_indexes=[1]), dict(TEXT_3B, num_hidden_layers=2), BENCH_PIXELS,
            QWEN_VOCAB, note="Qwen/Qwen2.5-VL-3B-Instruct's widths, 2 + 2 layers",
        ),
    }

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = qwen_tokenizer()
        processor = qwen_processor(tokenizer, arch.image["min_pixels"], arch.image["max_pixels"])
        model = seeded_model(cls.model_class, qwen_config(cls.config_class, tokenizer, arch), seed, dtype)
        return cls(model, processor, source=f"tiny:{cls.family}")
