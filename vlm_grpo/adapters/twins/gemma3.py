"""Gemma 3's twin and presets: Gemma's special tokens and turn format on a locally built tokenizer, the
processor, a config from an Architecture (the projection started random), and gemma-3-4b-it's sizes."""

from __future__ import annotations

import torch
from transformers import Gemma3Config, Gemma3ImageProcessor, Gemma3Processor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.seeding import seeded, seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

# Gemma's first ids, in order: <pad> 0, <eos> 1, <bos> 2, <unk> 3; then the turn and image markers.
GEMMA_SPECIAL_TOKENS = [
    "<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
    "<image_soft_token>",
]
IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
# Gemma's turn format: a system message is folded into the first user turn, the assistant speaks as `model`,
# and an image part is <start_of_image> (the processor expands it to the soft tokens between markers).
GEMMA_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set system = (messages[0]['content'] if messages[0]['content'] is string else "
    "messages[0]['content'] | map(attribute='text') | join('')) if messages[0]['role'] == 'system' else '' -%}"
    "{%- for message in messages if message['role'] != 'system' -%}"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' -}}"
    "{%- if loop.first and system -%}{{- system | trim + '\\n\\n' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<start_of_image>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

# 32-px images of 8-px patches (a 4x4 grid) pooled to 2x2 = 4 soft tokens; one sliding and one global layer,
# the window shorter than a prompt so the cache's sliding layers really slide.
TINY = Architecture(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                patch_size=8, vision_use_head=False),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
              layer_types=["sliding_attention", "full_attention"], max_position_embeddings=2048,
              tie_word_embeddings=False),  # untied so the tiny twin's `head` module group is not empty
    image=dict(mm_tokens_per_image=4),
)
# Public architecture of google/gemma-3-4b-it (SigLIP-So400m at 896 px, 256 soft tokens per image).
GEMMA3_4B = Architecture(
    vision=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16, image_size=896,
                patch_size=14, vision_use_head=False, layer_norm_eps=1e-6),
    text=dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
              num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=1024,
              max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    image=dict(mm_tokens_per_image=256),
    vocab_size=262208,
    note="google/gemma-3-4b-it",
)


class Gemma3Twin:
    """Mixed into Gemma3Adapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"gemma3_4b": GEMMA3_4B}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(GEMMA_SPECIAL_TOKENS, chat_template=GEMMA_CHAT_TEMPLATE, eos_token="<eos>",
                                    pad_token="<pad>", bos_token="<bos>", extra_special_tokens=IMAGE_TOKENS)
        ids = tokenizer.convert_tokens_to_ids
        tokens = arch.image["mm_tokens_per_image"]
        text = {"vocab_size": arch.vocab_size or len(tokenizer), "pad_token_id": ids("<pad>"),
                "eos_token_id": ids("<eos>"), "bos_token_id": ids("<bos>"), **arch.text}
        config = Gemma3Config(
            text_config=text, vision_config=dict(arch.vision), mm_tokens_per_image=tokens,
            boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
            image_token_index=ids("<image_soft_token>"), tie_word_embeddings=text.get("tie_word_embeddings", True),
        )
        side = arch.vision["image_size"]
        processor = Gemma3Processor(
            image_processor=Gemma3ImageProcessor(size={"height": side, "width": side}, image_mean=[0.5] * 3,
                                                 image_std=[0.5] * 3),
            tokenizer=tokenizer, chat_template=tokenizer.chat_template, image_seq_length=tokens,
        )
        model = seeded_model(cls.model_class, config, seed, dtype)
        with seeded(seed + 1), torch.no_grad():  # transformers starts this projection at zero: images would not count
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=config.initializer_range)
        model.generation_config.eos_token_id = [ids("<end_of_turn>"), ids("<eos>")]  # a turn ends the answer
        model.generation_config.pad_token_id = ids("<pad>")
        return cls(model, processor, source=f"tiny:{cls.family}")
