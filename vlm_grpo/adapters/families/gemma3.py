"""Gemma 3: a SigLIP tower average-pooled to a fixed square of soft tokens per image, a Gemma language model
with sliding-window and global layers, and image tokens that attend to each other both ways.

That two-way block is built from `token_type_ids` (1 on image tokens, from the processor): generation uses
it for the prefill, so every teacher-forced forward must get it too, extended with zeros over the completion
(a token-shaped tensor of the PromptBatch) and kept beside `inputs_embeds` in the shared-feature path.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

from vlm_grpo.adapters.architecture import Architecture
from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.image_layout import LayoutFacts, grid_cells
from vlm_grpo.adapters.module_groups import LLAVA_STYLE
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


class Gemma3Adapter(VLMAdapter):
    family = "gemma3"
    model_types = ("gemma3",)
    model_class = Gemma3ForConditionalGeneration
    # the projector's output is a bare weight matrix (after an RMSNorm), not a Linear module
    module_layout = replace(LLAVA_STYLE, projector_output=(r"model\.multi_modal_projector\.mm_input_projection_weight",))
    tiny_architecture = TINY
    presets = {"gemma3_4b": GEMMA3_4B}
    embedding_forward_keys = ("token_type_ids",)  # the two-way image attention block is built from them

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

    def _extra_suppressed_ids(self) -> list[int]:
        cfg = self.model.config
        return [cfg.boi_token_id, cfg.eoi_token_id]

    @property
    def tokens_per_image(self) -> int:
        return self.model.config.mm_tokens_per_image

    @property
    def pooled_side(self) -> int:
        """Image tokens per side of the pooled square grid."""
        return int(round(self.tokens_per_image**0.5))

    def _run_processor(self, texts, images, **text_options):
        # The chat template already opens with <bos>: a tokenizer that adds one too (the real Gemma tokenizer
        # does) would double it.
        return self.processor(text=texts, images=images if any(images) else None, padding=True,
                              return_tensors="pt", **{**text_options, "add_special_tokens": False})

    def _to_batch(self, features, images) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "pixel_values" in features:
            mm["pixel_values"] = features["pixel_values"]  # [n_images, 3, H, W]
            mm_rows["pixel_values"] = [len(s) for s in images]
        mm["token_type_ids"] = features["token_type_ids"]
        mm_rows["token_type_ids"] = [1] * len(images)
        return self._batch(features, images, mm, mm_rows, token_keys=("token_type_ids",))

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        images = batch.mm_rows.get("pixel_values", [0] * len(batch))
        return [n * self.tokens_per_image for n in images]

    # ---------------------------------------------------------------- attention-map layout
    def layout_facts(self, batch, sample, image):
        cfg = self.model.config
        patches = batch.mm["pixel_values"].shape[-1] // cfg.vision_config.patch_size  # per side, before pooling
        side = self.pooled_side
        if patches % side:
            raise ValueError(f"gemma3: a {patches}-patch side does not pool evenly to {side} tokens")
        return LayoutFacts(tiles=1, grid=(side, side))

    def image_token_positions(self, batch, sample, image, image_size=None):
        """The pooled square grid row-major over the whole image (resized to a square, never cropped)."""
        side = self.pooled_side
        return grid_cells(self.image_token_indices(batch, sample, image), side, side)
