"""Gemma 4's twin and presets: its turn, image and audio markers on a locally built tokenizer, the processor, a
config from an Architecture with a random start that trained weights would carry, and the E2B/E4B sizes."""

from __future__ import annotations

import torch
from transformers import (
    Gemma4AudioFeatureExtractor, Gemma4Config, Gemma4ImageProcessor, Gemma4Processor, Gemma4VideoProcessor
)

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.seeding import seeded, seeded_model
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

# Gemma's first ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3), then Gemma 4's turn, image and audio markers.
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>",
                  "<|audio>", "<audio|>", "<|audio|>", "<|video|>"]
MARKERS = {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>", "boa_token": "<|audio>",
           "eoa_token": "<audio|>", "audio_token": "<|audio|>"}
# Gemma 4's turns: <|turn>role ... <turn|>, the assistant speaking as `model`; an image part is <|image|> (the
# processor expands it to <|image> + its soft tokens + <image|>).
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|image|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}"
)

# 4-px patches pooled 3 x 3: the smallest budget (70 soft tokens, 630 patches) fits a ~100-px image, so a 56x56
# picture gives 64 soft tokens and a 2:1 one fewer. Sliding, global, sliding, global: the last two reuse the KV of
# the first two (as E2B's last 20 layers do); per-layer inputs of width 8.
TINY = Architecture(
    vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                head_dim=16, patch_size=4, pooling_kernel_size=3, position_embedding_size=64),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
              head_dim=16, global_head_dim=32, sliding_window=16, hidden_size_per_layer_input=8, num_kv_shared_layers=2,
              layer_types=["sliding_attention", "full_attention"] * 2,
              max_position_embeddings=2048, final_logit_softcapping=30.0, tie_word_embeddings=False),
    image=dict(max_soft_tokens=70),
)
GEMMA4_VOCAB = 262144


def gemma4_e(hidden: int, layers: int, intermediate: int, kv_heads: int, shared: int, period: int, double_wide: bool,
             note: str) -> Architecture:
    """The E2B/E4B layout: one global layer every `period` (the rest sliding over 512 tokens), the last `shared`
    layers reusing earlier KV; the vision tower both checkpoints share (16 x 768)."""
    return Architecture(
        vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=12,
                    num_key_value_heads=12, head_dim=64, patch_size=16, pooling_kernel_size=3,
                    position_embedding_size=10240, use_clipped_linears=True),
        text=dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=8,
                  num_key_value_heads=kv_heads, head_dim=256, global_head_dim=512, sliding_window=512,
                  hidden_size_per_layer_input=256, num_kv_shared_layers=shared, use_double_wide_mlp=double_wide,
                  layer_types=["full_attention" if i % period == period - 1 else "sliding_attention"
                               for i in range(layers)],
                  max_position_embeddings=131072, final_logit_softcapping=30.0, tie_word_embeddings=True),
        image=dict(max_soft_tokens=280), vocab_size=GEMMA4_VOCAB, note=note,
    )


class Gemma4Twin:
    """Mixed into Gemma4Adapter: the tiny twin's sizes, the presets and `build`."""

    tiny_architecture = TINY
    presets = {"gemma4_e2b": gemma4_e(1536, 35, 6144, 1, 20, 5, True, "google/gemma-4-E2B-it"),
               "gemma4_e4b": gemma4_e(2560, 42, 10240, 2, 18, 6, False, "google/gemma-4-E4B-it")}

    @classmethod
    def build(cls, arch, seed=0, dtype=torch.float32):
        tokenizer = build_tokenizer(SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE, eos_token="<eos>", pad_token="<pad>",
                                    bos_token="<bos>", extra_special_tokens=MARKERS)
        ids = tokenizer.convert_tokens_to_ids
        vocab = arch.vocab_size or len(tokenizer)
        text = {"vocab_size": vocab, "vocab_size_per_layer_input": vocab, "pad_token_id": ids("<pad>"),
                "eos_token_id": ids("<eos>"), "bos_token_id": ids("<bos>"), **arch.text}
        config = Gemma4Config(
            text_config=text, vision_config=dict(arch.vision), audio_config=None,
            boi_token_id=ids("<|image>"), eoi_token_id=ids("<image|>"), image_token_id=ids("<|image|>"),
            video_token_id=ids("<|video|>"), boa_token_id=ids("<|audio>"), eoa_token_index=ids("<audio|>"),
            audio_token_id=ids("<|audio|>"), tie_word_embeddings=text["tie_word_embeddings"],
        )
        sizing = dict(patch_size=arch.vision["patch_size"], pooling_kernel_size=arch.vision["pooling_kernel_size"],
                      max_soft_tokens=arch.image["max_soft_tokens"])
        processor = Gemma4Processor(
            feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=Gemma4ImageProcessor(**sizing),
            video_processor=Gemma4VideoProcessor(**sizing), tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
            image_seq_length=arch.image["max_soft_tokens"],
        )
        model = seeded_model(cls.model_class, config, seed, dtype)
        cls._random_start(model, seed)
        model.generation_config.eos_token_id = [ids("<turn|>"), ids("<eos>")]  # a turn ends the answer
        model.generation_config.pad_token_id = ids("<pad>")
        return cls(model, processor, source=f"tiny:{cls.family}")

    @staticmethod
    def _random_start(model, seed: int) -> None:
        """What trained weights carry and transformers' initialisation leaves out, for random-weight models: Gemma 4's
        attention is unscaled (the learned q-norm carries 1/sqrt(head_dim); at 1, random attention is near one-hot
        and half-precision rounding flips it), and the patch position table starts at ones with a narrow patch
        projection, so every image looks alike to the language model."""
        embedder = model.model.vision_tower.patch_embedder
        with seeded(seed + 1), torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("q_norm.weight"):
                    param.fill_(param.numel() ** -0.5)
            embedder.input_proj.weight.normal_(std=0.5)
            embedder.position_embedding_table.normal_(std=model.config.initializer_range)
