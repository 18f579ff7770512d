"""GLM-4.1V's twin and presets: GLM's special tokens and chat format on a locally built tokenizer, the
processor, a config from an Architecture, and GLM-4.1V-9B-Thinking's sizes."""

from __future__ import annotations

import torch
from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

SPECIAL_TOKENS = [
    "<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>",
    "<think>", "</think>",
]
# GLM's turns: `[gMASK]<sop>` once, then `<|role|>\n` + content per message; an image part is
# <|begin_of_image|><|image|><|end_of_image|> (the processor expands <|image|>); the answer follows <|assistant|>\n.
CHAT_TEMPLATE = (
    "{{- '[gMASK]<sop>' -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|begin_of_image|><|image|><|end_of_image|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def glm_rope(sections: list[int]) -> dict:
    """M-RoPE on half of each head: temporal/height/width sections sum to head_dim / 4."""
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections, "partial_rotary_factor": 0.5}


# 14-px patches merged 2x2 (a 56x56 image -> 4 tokens), the position table learned for a 56-px image.
TINY = Architecture(
    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, image_size=56, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=2048, rope_parameters=glm_rope([2, 1, 1])),
    image=dict(min_pixels=56 * 56 * 2, max_pixels=112 * 112 * 2),  # the budget counts both temporal frames
)
# Public architecture of zai-org/GLM-4.1V-9B-Thinking (transformers' Glm4vConfig defaults follow it).
GLM_4_1V_9B = Architecture(
    vision=dict(depth=24, hidden_size=1536, intermediate_size=13696, num_heads=12, image_size=336, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=4096, rms_norm_eps=1e-5),
    text=dict(hidden_size=4096, intermediate_size=13696, num_hidden_layers=40, num_attention_heads=32,
              num_key_value_heads=2, max_position_embeddings=65536, rms_norm_eps=1e-5,
              rope_parameters=glm_rope([8, 12, 12])),
    image=dict(min_pixels=112 * 112, max_pixels=14 * 14 * 2 * 2 * 2 * 6144),
    vocab_size=151552,
    note="zai-org/GLM-4.1V-9B-Thinking",
)


class Glm4vTwin:
    """Mixed into Glm4vAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"glm4_1v_9b": GLM_4_1V_9B}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE, eos_token="<|endoftext|>",
                                    pad_token="<|endoftext|>")
        ids = tokenizer.convert_tokens_to_ids
        text = {"vocab_size": arch.vocab_size or len(tokenizer), "pad_token_id": ids("<|endoftext|>"),
                "eos_token_id": ids("<|endoftext|>"), **arch.text}
        config = cls.config_class(
            text_config=text, vision_config=dict(arch.vision), image_token_id=ids("<|image|>"),
            video_token_id=ids("<|video|>"), image_start_token_id=ids("<|begin_of_image|>"),
            image_end_token_id=ids("<|end_of_image|>"), video_start_token_id=ids("<|begin_of_video|>"),
            video_end_token_id=ids("<|end_of_video|>"),
        )
        size = {"shortest_edge": arch.image["min_pixels"], "longest_edge": arch.image["max_pixels"]}
        patch = dict(patch_size=arch.vision["patch_size"], temporal_patch_size=arch.vision["temporal_patch_size"],
                     merge_size=arch.vision["spatial_merge_size"])
        processor = Glm4vProcessor(
            image_processor=Glm4vImageProcessor(size=size, **patch), tokenizer=tokenizer,
            video_processor=Glm4vVideoProcessor(**patch), chat_template=CHAT_TEMPLATE,
        )
        model = seeded_model(cls.model_class, config, seed, dtype)
        # an answer ends at the end of text or where the next turn would begin
        model.generation_config.eos_token_id = [ids("<|endoftext|>"), ids("<|user|>"), ids("<|observation|>")]
        model.generation_config.pad_token_id = ids("<|endoftext|>")
        return cls(model, processor, source=f"tiny:{cls.family}")
