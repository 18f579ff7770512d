"""Mistral 3's twin and presets: the Tekken control tokens and the v7 format on a locally built tokenizer, the Pixtral
processor, a config from an Architecture, and Mistral-Small-3.1-24B-Instruct-2503's sizes."""

from __future__ import annotations

import torch
from transformers import Mistral3Config, PixtralImageProcessor, PixtralProcessor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

# The Tekken control tokens in their order (ids 0-18), [IMG] at 10 as in the real vocabulary.
SPECIAL_TOKENS = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
    "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
]
# Mistral's v7 format: <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]answer</s>; an image part is [IMG]
# (the processor expands it into rows of placeholders).
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set open, close = {'system': ('[SYSTEM_PROMPT]', '[/SYSTEM_PROMPT]'), 'user': ('[INST]', '[/INST]'),"
    " 'assistant': ('', '</s>')}[message['role']] -%}"
    "{{- open -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '[IMG]' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- close -}}"
    "{%- endfor -%}"
)

# 8-px patches merged 2x2: a 56x56 image (resized to 48x48, multiples of 16) is 3x3 = 9 placeholders.
TINY = Architecture(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=16,
                patch_size=8, image_size=64),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=2048, sliding_window=None, tie_word_embeddings=False),
    image=dict(spatial_merge_size=2),
)
# Public architecture of mistralai/Mistral-Small-3.1-24B-Instruct-2503 (transformers' Mistral3Config defaults).
MISTRAL_SMALL_3_1 = Architecture(
    vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, head_dim=64,
                patch_size=14, image_size=1540, rope_theta=10000.0),
    text=dict(hidden_size=5120, intermediate_size=32768, num_hidden_layers=40, num_attention_heads=32,
              num_key_value_heads=8, head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
              rope_theta=1e9, sliding_window=None, tie_word_embeddings=False),
    image=dict(spatial_merge_size=2),
    vocab_size=131072,
    note="mistralai/Mistral-Small-3.1-24B-Instruct-2503",
)


class Mistral3Twin:
    """Mixed into Mistral3Adapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"mistral_small_3_1": MISTRAL_SMALL_3_1}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE, eos_token="</s>", pad_token="<pad>",
                                    bos_token="<s>")
        ids = tokenizer.convert_tokens_to_ids
        merge = arch.image["spatial_merge_size"]
        text = {"vocab_size": arch.vocab_size or len(tokenizer), "pad_token_id": ids("<pad>"), "bos_token_id": ids("<s>"),
                "eos_token_id": ids("</s>"), **arch.text}
        config = Mistral3Config(text_config=text, vision_config=dict(arch.vision), image_token_index=ids("[IMG]"),
                                spatial_merge_size=merge, tie_word_embeddings=text["tie_word_embeddings"])
        patch = arch.vision["patch_size"]
        processor = PixtralProcessor(
            image_processor=PixtralImageProcessor(size={"longest_edge": arch.vision["image_size"]},
                                                  patch_size={"height": patch, "width": patch},
                                                  image_mean=[0.5] * 3, image_std=[0.5] * 3),
            tokenizer=tokenizer, patch_size=patch, spatial_merge_size=merge, chat_template=CHAT_TEMPLATE,
        )
        model = seeded_model(cls.model_class, config, seed, dtype)
        model.generation_config.pad_token_id = ids("<pad>")
        return cls(model, processor, source=f"tiny:{cls.family}")
