"""Gemma 4 (E2B/E4B): a ViT over a variable number of 16-px patches (the image resized, aspect kept, to a soft-token
budget), average-pooled k x k into soft tokens and projected by `embed_vision`; a Gemma language model with
sliding and global layers, per-layer input embeddings looked up from the token ids, KV shared by the last layers.

Per image the processor returns a fixed-length row of patches (padding marked by position -1) and the (x, y)
position of each patch: the image's soft-token count and grid are read off those positions. The per-layer input
embeddings are why a features forward keeps `input_ids`: the model looks them up from the ids (the image tokens as
padding) and takes the precomputed image features as `mm_encoder_outputs`, exactly as from pixels.
"""

from __future__ import annotations

import torch
from transformers import Gemma4ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch, sample_rows, sum_per_sample
from vlm_grpo.adapters.image_layout import OneGridLayout
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.gemma4 import Gemma4Twin

LAYOUT = ModuleLayout(
    vision=(r"model\.vision_tower\.",),
    projector=(r"model\.embed_vision\.",),
    language=(r"model\.language_model\.",),
)


class Gemma4Adapter(Gemma4Twin, OneGridLayout, VLMAdapter):
    family = "gemma4"
    model_types = ("gemma4",)
    model_class = Gemma4ForConditionalGeneration
    module_layout = LAYOUT
    pixel_keys = ("pixel_values", "image_position_ids")  # both read only by the vision tower

    def _extra_suppressed_ids(self) -> list[int]:
        cfg = self.model.config
        return [cfg.boi_token_id, cfg.eoi_token_id, cfg.video_token_id, cfg.audio_token_id]

    @property
    def pooling(self) -> int:
        return self.model.config.vision_config.pooling_kernel_size

    def _run_processor(self, texts, images):
        # The chat template opens with <bos>: a tokenizer adding one too would double it.
        return self.processor(text=texts, images=images if any(images) else None, padding=True, return_tensors="pt",
                              add_special_tokens=False)

    def _to_batch(self, features, images) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "pixel_values" in features:
            n_images = [len(s) for s in images]
            for key in ("pixel_values", "image_position_ids"):  # [n_images, max_patches, ...]: a row per image
                mm[key], mm_rows[key] = features[key], n_images
        mm["mm_token_type_ids"] = features["mm_token_type_ids"]  # the image blocks of bidirectional checkpoints
        mm_rows["mm_token_type_ids"] = [1] * len(images)
        return self._batch(features, images, mm, mm_rows, token_keys=("mm_token_type_ids",))

    def patch_grid(self, positions: torch.Tensor) -> tuple[int, int]:
        """(rows, cols) of one image's patches, from its (x, y) patch positions (-1: padding)."""
        real = positions[(positions >= 0).all(dim=-1)]
        return int(real[:, 1].max()) + 1, int(real[:, 0].max()) + 1

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        if "image_position_ids" not in batch.mm:
            return [0] * len(batch)
        per_image = [(rows // self.pooling) * (cols // self.pooling)
                     for rows, cols in map(self.patch_grid, batch.mm["image_position_ids"])]
        return sum_per_sample(per_image, batch.mm_rows["image_position_ids"])

    # ---------------------------------------------------------------- sharing hooks (per-layer inputs)
    def inputs_with_features(self, full_inputs, features, core):
        inputs = {k: v for k, v in full_inputs.items() if k not in self.pixel_keys}
        if features.flat.shape[0]:
            inputs["mm_encoder_outputs"] = {"image": BaseModelOutputWithPooling(pooler_output=(features.flat,))}
        return inputs

    # ---------------------------------------------------------------- attention-map layout
    def image_grid(self, batch: PromptBatch, sample: int, image: int) -> tuple[int, int]:
        """(rows, cols) of the pooled patches over the whole image (resized, aspect kept, never cropped)."""
        rows, cols = self.patch_grid(sample_rows(batch, "image_position_ids", sample)[image])
        return rows // self.pooling, cols // self.pooling
