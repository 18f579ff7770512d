"""Mistral 3 (Mistral Small 3.1): a Pixtral vision tower over each image at its own size (aspect kept, sides
multiples of patch x merge), its patches merged 2x2 by a learned layer and projected into a Mistral language model.

The processor writes an image as rows of `[IMG]` placeholders, each row closed by `[IMG_BREAK]` and the last by
`[IMG_END]`: one image is several runs of placeholders, joined here into one span. Both markers are ordinary tokens
(embedded as text, never features) that the policy must not emit. The image's size after resizing is in
`image_sizes`, from which the merged grid and its feature count follow.
"""

from __future__ import annotations

from transformers import Mistral3ForConditionalGeneration

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch, sample_rows, sum_per_sample
from vlm_grpo.adapters.image_layout import OneGridLayout, token_runs
from vlm_grpo.adapters.module_groups import LLAVA_STYLE
from vlm_grpo.adapters.twins.mistral3 import Mistral3Twin


class Mistral3Adapter(Mistral3Twin, OneGridLayout, VLMAdapter):
    family = "mistral3"
    model_types = ("mistral3",)
    model_class = Mistral3ForConditionalGeneration
    module_layout = LLAVA_STYLE
    pixel_keys = ("pixel_values", "image_sizes")  # both read only by the vision tower

    @property
    def marker_ids(self) -> list[int]:
        return self.tokenizer.convert_tokens_to_ids(["[IMG_BREAK]", "[IMG_END]"])

    def _extra_suppressed_ids(self) -> list[int]:
        return self.marker_ids

    def _run_processor(self, texts, images):
        # The chat template opens with <s>: a tokenizer adding one too would double it.
        flat = [img for sample in images for img in sample]
        return self.processor(text=texts, images=flat or None, padding=True, return_tensors="pt",
                              add_special_tokens=False)

    def _to_batch(self, features, images) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "pixel_values" in features:  # [n_images, 3, H, W], each image padded to the largest
            n_images = [len(s) for s in images]
            for key in ("pixel_values", "image_sizes"):
                mm[key], mm_rows[key] = features[key], n_images
        return self._batch(features, images, mm, mm_rows)

    @property
    def merged_patch(self) -> int:
        cfg = self.model.config
        return cfg.vision_config.patch_size * cfg.spatial_merge_size

    def image_grid(self, batch: PromptBatch, sample: int, image: int) -> tuple[int, int]:
        """(rows, cols) of the merged-patch grid of one image, from its resized size."""
        height, width = sample_rows(batch, "image_sizes", sample)[image].tolist()
        return height // self.merged_patch, width // self.merged_patch

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        if "image_sizes" not in batch.mm:
            return [0] * len(batch)
        per_image = [(h // self.merged_patch) * (w // self.merged_patch) for h, w in batch.mm["image_sizes"].tolist()]
        return sum_per_sample(per_image, batch.mm_rows["image_sizes"])

    def image_token_spans(self, input_ids, images_per_sample):
        """Rows of placeholders joined across the [IMG_BREAK] between them: one span per image, up to [IMG_END]."""
        breaks = self.marker_ids[0]
        spans = []
        for row in input_ids.tolist():
            merged: list[tuple[int, int]] = []
            for start, end in token_runs(row, self.image_token_id):
                if merged and merged[-1][1] == start - 1 and row[start - 1] == breaks:
                    merged[-1] = (merged[-1][0], end)
                else:
                    merged.append((start, end))
            spans.append(merged)
        return spans
