"""Gemma 3: a SigLIP tower average-pooled to a fixed square of soft tokens per image, a Gemma language model
with sliding-window and global layers, and image tokens that attend to each other both ways.

That two-way block is built from `token_type_ids` (1 on image tokens, from the processor): generation uses
it for the prefill, so every teacher-forced forward must get it too, extended with zeros over the completion
(a token-shaped tensor of the PromptBatch) and kept beside `inputs_embeds` in the shared-feature path.
"""

from __future__ import annotations

from dataclasses import replace

from transformers import Gemma3ForConditionalGeneration

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.image_layout import LayoutFacts, grid_cells
from vlm_grpo.adapters.module_groups import LLAVA_STYLE
from vlm_grpo.adapters.twins.gemma3 import Gemma3Twin


class Gemma3Adapter(Gemma3Twin, VLMAdapter):
    family = "gemma3"
    model_types = ("gemma3",)
    model_class = Gemma3ForConditionalGeneration
    # the projector's output is a bare weight matrix (after an RMSNorm), not a Linear module
    module_layout = replace(LLAVA_STYLE, projector_output=(r"model\.multi_modal_projector\.mm_input_projection_weight",))
    embedding_forward_keys = ("token_type_ids",)  # the two-way image attention block is built from them

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
