"""LLaVA-OneVision: a SigLIP tower and a 2-layer MLP projector in front of a Qwen2 language model, with "anyres"
images: an image alone in its prompt is encoded as a base tile (the whole image at the tower's size) plus the
tiles of the best-fitting grid of `image_grid_pinpoints`; the tiles' features are stitched, the letterbox padding
cut away (`unpad_image`), shrunk when larger than 9 tiles' worth, and each row closed by `image_newline`. An image
that shares its prompt with others is its base tile plus one newline.

So an image's placeholders are: the base grid, then the fine grid row by row with a newline token after each row
(or a single newline). Newline tokens are image tokens (the model puts a learned vector there) but cover no part
of the image: `image_token_indices` leaves them out of the heatmap cells. The fine grid's size is computed with the
model's own anyres helpers from `image_sizes`; `check_alignment` compares it with the processor's count.
"""

from __future__ import annotations

import math

import torch
from transformers import LlavaOnevisionForConditionalGeneration
from transformers.models.llava_onevision.modeling_llava_onevision import get_anyres_image_grid_shape, unpad_image

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch, sample_rows
from vlm_grpo.adapters.image_layout import LayoutFacts, grid_cells
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.twins.llava_onevision import LlavaOnevisionTwin, without_unused_norm

LAYOUT = ModuleLayout(
    vision=(r"model\.vision_tower\.",),
    # the MLP projector and the learned row-end vector it is stitched with, both in the language model's width
    projector=(r"model\.multi_modal_projector\.", r"model\.image_newline"),
    language=(r"model\.language_model\.",),
    projector_output=(r"model\.multi_modal_projector\.linear_2\.",),
)


class LlavaOnevisionAdapter(LlavaOnevisionTwin, VLMAdapter):
    family = "llava_onevision"
    model_types = ("llava_onevision",)
    model_class = LlavaOnevisionForConditionalGeneration
    module_layout = LAYOUT

    @classmethod
    def load(cls, path, **kwargs):
        adapter = super().load(path, **kwargs)
        without_unused_norm(adapter.model)
        return adapter

    def _extra_suppressed_ids(self) -> list[int]:
        return [self.model.config.video_token_index]

    def _run_processor(self, texts, images):
        # images per prompt: an image alone in its prompt is tiled, one among several is not
        nested = [sample for sample in images if sample]
        return self.processor(text=texts, images=nested or None, padding=True, return_tensors="pt")

    def _to_batch(self, features, images) -> PromptBatch:
        n_images = [len(s) for s in images]
        mm, mm_rows = {}, {}
        if "pixel_values" in features:  # [n_images, max_tiles, 3, H, W] padded, image_sizes [n_images, 2]
            for key in ("pixel_values", "image_sizes"):
                mm[key], mm_rows[key] = features[key], n_images
            # per prompt, text-only ones included (the processor's own count skips them)
            mm["batch_num_images"], mm_rows["batch_num_images"] = torch.tensor(n_images), [1] * len(images)
        return self._batch(features, images, mm, mm_rows)

    def combine_images(self, sources, keys):
        # batch_num_images is one count per new sample (its images, over all its sources), not rows to concatenate
        mm, mm_rows = super().combine_images(sources, [k for k in keys if k != "batch_num_images"])
        if "batch_num_images" in keys:
            counts = [sum(b.mm_rows["pixel_values"][i] for b, i in group if "pixel_values" in b.mm) for group in sources]
            mm["batch_num_images"], mm_rows["batch_num_images"] = torch.tensor(counts), [1] * len(sources)
        return mm, mm_rows

    # ---------------------------------------------------------------- geometry
    @property
    def base_side(self) -> int:
        vision = self.model.config.vision_config
        return vision.image_size // vision.patch_size

    def fine_grid(self, image_size) -> tuple[int, int]:
        """(rows, cols) of an image's stitched tile features after unpadding and the anyres_max shrink, as
        `pack_image_features` computes them."""
        cfg, side = self.model.config, self.base_side
        tiles_h, tiles_w = get_anyres_image_grid_shape(image_size, cfg.image_grid_pinpoints, cfg.vision_config.image_size)
        rows, cols = unpad_image(torch.empty(0, tiles_h * side, tiles_w * side), image_size).shape[1:]
        ratio = math.sqrt(rows * cols / (int(cfg.vision_aspect_ratio.strip("anyres_max_")) * side**2))
        return (int(rows // ratio), int(cols // ratio)) if ratio > 1.1 else (rows, cols)

    def _tiled_size(self, batch, sample, image) -> list[int] | None:
        """The image's size when it is tiled (alone in its prompt); None when it shares its prompt."""
        sizes = sample_rows(batch, "image_sizes", sample)
        return sizes[image].tolist() if len(sizes) == 1 else None

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        if "image_sizes" not in batch.mm:
            return [0] * len(batch)
        counts = []
        for sample, n in enumerate(batch.mm_rows["image_sizes"]):
            total = 0
            for image in range(n):
                size = self._tiled_size(batch, sample, image)
                rows, cols = self.fine_grid(size) if size is not None else (0, 0)
                total += self.base_side**2 + (rows * (cols + 1) if size is not None else 1)
            counts.append(total)
        return counts

    def image_token_indices(self, batch, sample, image):
        """The image's placeholders that cover part of it: the base grid and the fine grid, newlines left out."""
        tokens = super().image_token_indices(batch, sample, image)
        base = self.base_side**2
        size = self._tiled_size(batch, sample, image)
        if size is None:
            return tokens[:base]
        _, cols = self.fine_grid(size)
        fine = tokens[base:]
        return tokens[:base] + [t for k, t in enumerate(fine) if k % (cols + 1) != cols]

    # ---------------------------------------------------------------- attention-map layout
    def layout_facts(self, batch, sample, image):
        size = self._tiled_size(batch, sample, image)
        side = (self.base_side, self.base_side)
        if size is None:
            return LayoutFacts(tiles=1, grid=side)
        return LayoutFacts(tiles=2, grid=self.fine_grid(size), global_grid=side, global_first=True)

    def image_token_positions(self, batch, sample, image, image_size=None):
        """The base grid over the whole image, then (an image alone) the fine grid over it too, row-major."""
        tokens = self.image_token_indices(batch, sample, image)
        base = self.base_side**2
        cells = grid_cells(tokens[:base], self.base_side, self.base_side)
        size = self._tiled_size(batch, sample, image)
        if size is not None:
            cells += grid_cells(tokens[base:], *self.fine_grid(size))
        return cells
