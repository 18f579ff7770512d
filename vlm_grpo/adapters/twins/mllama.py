"""Mllama's twin and presets: Llama 3's header tokens and format on a locally built tokenizer, the tiling
processor, a config from an Architecture (the cross-attention gates opened), and Llama-3.2-11B-Vision's sizes."""

from __future__ import annotations

import torch
from transformers import MllamaConfig, MllamaImageProcessor, MllamaProcessor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.seeding import seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>"]
# Llama 3's header format; an image part is <|image|> where it stands (the model reads the tiles by cross-attention).
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|image|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)
# 32-px tiles of 8-px patches (16 patches + a class token each), at most 2 tiles per image: a wide picture gets two
# tiles, a square one one. Three text layers, the middle one cross-attention.
TINY = Architecture(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
                image_size=32, patch_size=8, max_num_tiles=2, intermediate_layers_indices=[0],
                vision_output_dim=64, supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]]),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
              cross_attention_layers=[1], max_position_embeddings=2048, tie_word_embeddings=False),
)
# Public architecture of meta-llama/Llama-3.2-11B-Vision-Instruct.
LLAMA_3_2_11B_VISION = Architecture(
    vision=dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_global_layers=8, attention_heads=16,
                image_size=560, patch_size=14, max_num_tiles=4, intermediate_layers_indices=[3, 7, 15, 23, 30],
                vision_output_dim=7680, norm_eps=1e-5),
    text=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=40, num_attention_heads=32,
              num_key_value_heads=8, cross_attention_layers=[3, 8, 13, 18, 23, 28, 33, 38],
              max_position_embeddings=131072, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
              "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}, tie_word_embeddings=False),
    vocab_size=128256,
    note="meta-llama/Llama-3.2-11B-Vision-Instruct",
)


class MllamaTwin:
    """Mixed into MllamaAdapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"llama_3_2_11b_vision": LLAMA_3_2_11B_VISION}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE, eos_token="<|eot_id|>",
                                    pad_token="<|finetune_right_pad_id|>", bos_token="<|begin_of_text|>")
        ids = tokenizer.convert_tokens_to_ids
        text = {"vocab_size": arch.vocab_size or len(tokenizer), "pad_token_id": ids("<|finetune_right_pad_id|>"),
                "bos_token_id": ids("<|begin_of_text|>"), "eos_token_id": ids("<|eot_id|>"), **arch.text}
        config = MllamaConfig(text_config=text, vision_config=dict(arch.vision), image_token_index=ids("<|image|>"),
                              tie_word_embeddings=False)
        side = arch.vision["image_size"]
        processor = MllamaProcessor(
            image_processor=MllamaImageProcessor(size={"height": side, "width": side},
                                                 max_image_tiles=arch.vision["max_num_tiles"],
                                                 image_mean=[0.5] * 3, image_std=[0.5] * 3),
            tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
        )
        model = seeded_model(cls.model_class, config, seed, dtype)
        with torch.no_grad():  # transformers opens the cross-attention gates at zero: the image would not count
            for name, p in model.named_parameters():
                if name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate")):
                    p.fill_(1.0)
        model.generation_config.eos_token_id = [ids("<|eot_id|>"), ids("<|end_of_text|>")]
        model.generation_config.pad_token_id = ids("<|finetune_right_pad_id|>")
        return cls(model, processor, source=f"tiny:{cls.family}")
