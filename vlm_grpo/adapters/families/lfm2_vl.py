"""LFM2-VL: a SigLIP2 NaFlex tower (each image or tile at its own patch grid, padded to a fixed patch count with a
mask), 2x2 pixel-unshuffle + MLP projector, and an LFM2 language model (short-convolution layers with a few
attention layers between them).

An image small enough is resized to one tile; a larger one is cut into a rows x cols grid of square tiles plus a
downscaled thumbnail. Each tile is a row of `pixel_values` / `pixel_attention_mask` / `spatial_shapes`, and its
feature count is its patch grid halved per side. The processor drops the tile grid of each image from its output,
so the image processor runs here with `return_row_col_info` and the placeholders are written with the processor's
own `replace_image_token`; the grid is kept in `PromptBatch.meta` (bookkeeping the model never sees).
"""

from __future__ import annotations

import math

import torch
from transformers import Lfm2VlForConditionalGeneration

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch, sum_per_sample
from vlm_grpo.adapters.image_layout import LayoutFacts, grid_cells
from vlm_grpo.adapters.module_groups import LLAVA_STYLE
from vlm_grpo.adapters.twins.lfm2_vl import Lfm2VlTwin


class Lfm2VlAdapter(Lfm2VlTwin, VLMAdapter):
    family = "lfm2_vl"
    model_types = ("lfm2_vl",)
    model_class = Lfm2VlForConditionalGeneration
    module_layout = LLAVA_STYLE

    def _extra_suppressed_ids(self) -> list[int]:
        markers = ["<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
        markers += [t for t in self.tokenizer.get_vocab() if t.startswith("<|img_row_")]
        return self.tokenizer.convert_tokens_to_ids(markers)

    def _run_processor(self, texts, images):
        flat = [img for sample in images for img in sample]
        tiles = {}
        if flat:  # the processor's own steps, keeping each image's tile grid
            tiles = self.processor.image_processor(flat, return_row_col_info=True, return_tensors="pt")
            replacements = [self.processor.replace_image_token(tiles, i, use_image_special_tokens=True)
                            for i in range(len(flat))]
            texts, _ = self.processor.get_text_with_replacements(texts, replacements)
        features = dict(self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False))
        if flat:
            features.update({k: tiles[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")})
            features["image_tiles"] = torch.tensor([[r, c] for r, c in zip(tiles["image_rows"], tiles["image_cols"])])
        return features

    def _to_batch(self, features, images) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "image_tiles" in features:
            n_images = [len(s) for s in images]
            per_image = [self.tile_count(r, c) for r, c in features["image_tiles"].tolist()]
            for key in ("pixel_values", "pixel_attention_mask", "spatial_shapes"):  # a row per tile
                mm[key], mm_rows[key] = features[key], sum_per_sample(per_image, n_images)
        batch = self._batch(features, images, mm, mm_rows)
        if "image_tiles" in features:  # bookkeeping: the model takes no tile grid
            batch.meta["image_tiles"], batch.meta_rows["image_tiles"] = features["image_tiles"], n_images
        return batch

    def image_token_spans(self, input_ids, images_per_sample):
        """Each image between its <|image_start|> and <|image_end|> (its tiles' runs are split by tile markers)."""
        start, end = self.tokenizer.convert_tokens_to_ids(["<|image_start|>", "<|image_end|>"])
        spans = []
        for row in input_ids.tolist():
            opens = [k + 1 for k, tok in enumerate(row) if tok == start]
            spans.append(list(zip(opens, [k for k, tok in enumerate(row) if tok == end])))
        return spans

    def tile_count(self, rows: int, cols: int) -> int:
        """Tile rows of an image cut into rows x cols: the crops, plus the thumbnail of a multi-tile image."""
        return rows * cols + (1 if rows * cols > 1 and self.processor.image_processor.use_thumbnail else 0)

    @property
    def downsample(self) -> int:
        return self.model.config.downsample_factor

    def tile_grid(self, shape) -> tuple[int, int]:
        """(rows, cols) of one tile's tokens, from its patch grid."""
        height, width = (int(v) for v in shape)
        return math.ceil(height / self.downsample), math.ceil(width / self.downsample)

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        if "spatial_shapes" not in batch.mm:
            return [0] * len(batch)
        per_tile = [r * c for r, c in map(self.tile_grid, batch.mm["spatial_shapes"].tolist())]
        return sum_per_sample(per_tile, batch.mm_rows["spatial_shapes"])

    # ---------------------------------------------------------------- attention-map layout
    def _image_tiles(self, batch, sample, image):
        """(rows, cols) of the image's tile grid and its tiles' spatial shapes (crops row-major, then thumbnail)."""
        first = sum(batch.meta_rows["image_tiles"][:sample])  # the sample's first image
        counts = [self.tile_count(r, c) for r, c in batch.meta["image_tiles"].tolist()]
        start = sum(batch.mm_rows["spatial_shapes"][:sample]) + sum(counts[first : first + image])
        rows, cols = batch.meta["image_tiles"][first + image].tolist()
        return rows, cols, batch.mm["spatial_shapes"][start : start + counts[first + image]].tolist()

    def layout_facts(self, batch, sample, image):
        rows, cols, shapes = self._image_tiles(batch, sample, image)
        thumbnail = self.tile_grid(shapes[-1]) if len(shapes) > rows * cols else None
        return LayoutFacts(tiles=len(shapes), grid=self.tile_grid(shapes[0]), global_grid=thumbnail)

    def image_token_positions(self, batch, sample, image, image_size=None):
        """One tile: its grid over the whole image. Several: the tiles row-major over the image, each its grid, then
        the thumbnail's grid over all of it."""
        tokens = self.image_token_indices(batch, sample, image)
        rows, cols, shapes = self._image_tiles(batch, sample, image)
        cells, pos = [], 0
        for t, shape in enumerate(shapes):
            r, c = divmod(t, cols)
            crop = len(shapes) > 1 and t < rows * cols
            box = (r / rows, c / cols, (r + 1) / rows, (c + 1) / cols) if crop else (0.0, 0.0, 1.0, 1.0)
            grid = self.tile_grid(shape)
            cells += grid_cells(tokens[pos : pos + grid[0] * grid[1]], *grid, box)
            pos += grid[0] * grid[1]
        return cells
