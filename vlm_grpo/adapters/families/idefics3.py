"""Idefics3 (and, via smolvlm.py, SmolVLM): images split into tiles, padded per sample.

Layout of one image in the prompt (the processor expands the single `<image>` placeholder):
    split image:  per tile, row-major: <fake_token_around_image><row_i_col_j><image>*S, a "\n" after each
                  row, then "\n" + the global tile: <fake_token_around_image><global-img><image>*S
                  <fake_token_around_image>
    small image:  only the global tile.
S = image_seq_len = (image_size/patch)^2 / scale_factor^2 tokens per tile, a side x side grid in
row-major order (the connector's pixel shuffle keeps that order).
Multimodal tensors: pixel_values [B, max_tiles, 3, H, W] and pixel_attention_mask [B, max_tiles, H, W];
padding tiles are all-zero images, which the model drops before the vision tower.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import torch
from transformers import Idefics3ForConditionalGeneration

from vlm_grpo.adapters.base import ImageTokenMismatch, VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch, sum_per_sample
from vlm_grpo.adapters.features import with_mask_positions
from vlm_grpo.adapters.image_layout import LayoutFacts, tiled_cells, token_runs
from vlm_grpo.adapters.module_groups import ModuleLayout
from vlm_grpo.adapters.quirks import CacheQuirk
from vlm_grpo.adapters.twins.idefics3 import FAKE_TOKEN, GLOBAL_TOKEN, ROW_COL_TOKENS, Idefics3Twin, TiledTwin


class TileGrid(NamedTuple):
    """Where an image's tokens sit. `rows` x `cols` split tiles in row-major order (0 x 0 when the image
    fit in one tile and was not split), always followed by one global tile of the whole image. Each tile
    is `side` x `side` tokens (side = sqrt(image_seq_len)), row-major."""

    rows: int
    cols: int
    side: int

    @property
    def tiles(self) -> int:
        return self.rows * self.cols + 1


TILED_LAYOUT = ModuleLayout(
    vision=(r"model\.vision_model\.",), projector=(r"model\.connector\.",), language=(r"model\.text_model\.",),
)


class TiledImageAdapter(TiledTwin, VLMAdapter):
    """Shared by Idefics3 and SmolVLM: same model layout, same prompt expansion."""

    module_layout = TILED_LAYOUT
    cache_quirks = (
        # The VSR study (seed) saw cached decoding lose the image tokens with a pre-5 transformers; it did not pin
        # the range, so the whole 4.x line is treated as unsafe.
        CacheQuirk(transformers="<5.0", reason="Idefics3 merges image features only when image tokens are in the "
                   "step's input; cached decode steps dropped them (the VSR study's no-cache workaround)"),
    )

    def _token_id(self, token: str) -> int:
        return self.tokenizer.convert_tokens_to_ids(token)

    def _extra_suppressed_ids(self) -> list[int]:
        return [self._token_id(t) for t in (FAKE_TOKEN, GLOBAL_TOKEN, *ROW_COL_TOKENS)]

    @property
    def image_seq_len(self) -> int:
        cfg = self.model.config
        return (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2 // cfg.scale_factor**2

    # ---------------------------------------------------------------- encoding
    def _run_processor(self, texts, images, **text_options):
        # Nested per-sample lists: SmolVLM's processor needs them, Idefics3's accepts them.
        if not any(images):
            return self.processor(text=texts, padding=True, return_tensors="pt", **text_options)
        return self.processor(text=texts, images=images, padding=True, return_tensors="pt", **text_options)

    def _to_batch(self, features, images) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "pixel_values" in features:
            # Each sample owns its own row of padded tiles, so grouping copies whole rows.
            mm["pixel_values"] = features["pixel_values"]
            mm["pixel_attention_mask"] = features["pixel_attention_mask"].bool()
            mm_rows = {"pixel_values": [1] * len(images), "pixel_attention_mask": [1] * len(images)}
        return self._batch(features, images, mm, mm_rows)

    def real_tiles(self, batch: PromptBatch) -> list[int]:
        """Tiles the model will encode per sample. It drops tiles whose pixels are all exactly zero
        (the processor's padding), so that, not the pixel mask, decides what counts."""
        if "pixel_values" not in batch.mm:
            return [0] * len(batch)
        per_row = batch.mm["pixel_values"].flatten(2).ne(0).any(dim=2).sum(dim=1).tolist()
        return sum_per_sample(per_row, batch.mm_rows["pixel_values"])  # a row per sample (images) or per video

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        return [n * self.image_seq_len for n in self.real_tiles(batch)]

    def image_token_spans(self, input_ids, images_per_sample):
        """One [start, end) per image, from its first tile's `<image>` run to the end of its global tile.

        Tile runs are separated by delimiter tokens; an image ends with the run right after `<global-img>`.
        """
        global_id = self._token_id(GLOBAL_TOKEN)
        spans = []
        for i, (row, n_images) in enumerate(zip(input_ids.tolist(), images_per_sample)):
            sample, first = [], None
            for run_start, run_end in token_runs(row, self.image_token_id):
                first = run_start if first is None else first
                if run_start > 0 and row[run_start - 1] == global_id:
                    sample.append((first, run_end))
                    first = None
            if len(sample) != n_images:
                raise ImageTokenMismatch(
                    f"sample {i}: the prompt holds {len(sample)} complete image layouts "
                    f"but {n_images} images ({self.family})"
                )
            spans.append(sample)
        return spans

    # ---------------------------------------------------------------- forward
    def model_inputs(self, batch):
        # With only padding tiles left (e.g. text-only samples picked out of a mixed batch) the model crashes
        # instead of skipping them: drop the tile tensors then.
        if "pixel_values" in batch.mm and not any(self.real_tiles(batch)):
            batch = replace(batch, mm={}, mm_rows={})
        return batch.model_inputs()

    def completion_inputs(self, batch, completion_ids, completion_mask, completion_types=None):
        # The positions generate() used (counted from each row's first real token). RoPE makes a
        # per-row shift harmless in exact arithmetic; passing them keeps the rounding identical too.
        return with_mask_positions(super().completion_inputs(batch, completion_ids, completion_mask, completion_types))

    def can_join(self, rows):
        return True  # combine_images pads tiles as the processor does

    def combine_images(self, sources, keys):
        # Each sample owns one row of tiles, padded to the batch's most: join a sample's tiles, then pad again.
        mm, mm_rows = {}, {}
        for key in keys:
            parts = [[b.mm[key][i] for b, i in group if key in b.mm] for group in sources]
            if not any(parts):
                continue
            like = next(p[0] for p in parts if p)
            tiles = [torch.cat(p) if p else like[:0] for p in parts]
            most = max(t.shape[0] for t in tiles)
            mm[key] = torch.stack([torch.cat([t, t.new_zeros(most - t.shape[0], *t.shape[1:])]) for t in tiles])
            mm_rows[key] = [1] * len(sources)
        return mm, mm_rows

    # ---------------------------------------------------------------- attention-map layout
    def image_grid(self, batch: PromptBatch, sample: int, image: int) -> TileGrid:
        """The tile layout of one image, read from the row/col tokens inside its span (see TileGrid)."""
        start, end = batch.image_spans[sample][image]
        tokens = set(batch.input_ids[sample, start:end].tolist())
        rows = cols = 0
        for i in range(1, 7):
            for j in range(1, 7):
                if self._token_id(f"<row_{i}_col_{j}>") in tokens:
                    rows, cols = max(rows, i), max(cols, j)
        return TileGrid(rows, cols, int(round(self.image_seq_len**0.5)))

    def layout_facts(self, batch, sample, image):
        tiles = int(batch.mm["pixel_values"][sample].flatten(1).ne(0).any(1).sum())  # one image per sample
        cfg = self.model.config
        side = cfg.vision_config.image_size // cfg.vision_config.patch_size // cfg.scale_factor
        return LayoutFacts(tiles=tiles, grid=(side, side))

    def image_token_positions(self, batch, sample, image, image_size=None):
        """Split tiles row-major over the image (each side x side tokens, row-major), then the global tile."""
        grid = self.image_grid(batch, sample, image)
        tokens = self.image_token_indices(batch, sample, image)
        if len(tokens) != grid.tiles * grid.side**2:
            raise ValueError(f"{self.family}: {len(tokens)} image tokens for {grid.tiles} tiles of {grid.side**2}")
        return tiled_cells(tokens, grid.rows, grid.cols, grid.side)


class Idefics3Adapter(Idefics3Twin, TiledImageAdapter):
    family = "idefics3"
    model_types = ("idefics3",)
    model_class = Idefics3ForConditionalGeneration
