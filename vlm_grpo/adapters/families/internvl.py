"""InternVL (native transformers classes): images become square tiles, each tile a fixed token run.

The processor crops an image into a grid of tiles (plus a thumbnail when there is more than one)
and stacks every tile of every image into one flat `pixel_values` [total_tiles, 3, H, W]. It does
not return how many tiles each image got, so the adapter recomputes that from the image sizes with
the image processor's own tiling rule and records it as `mm_rows["pixel_values"]`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import InternVLForConditionalGeneration

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.batch import PromptBatch, sum_per_sample
from vlm_grpo.adapters.image_layout import LayoutFacts, tiled_cells
from vlm_grpo.adapters.module_groups import LLAVA_STYLE
from vlm_grpo.adapters.twins.internvl import InternVLTwin, tokens_per_tile


class InternVLAdapter(InternVLTwin, VLMAdapter):
    family = "internvl"
    model_types = ("internvl",)
    model_class = InternVLForConditionalGeneration
    module_layout = LLAVA_STYLE
    takes_video = True  # frames laid out as one-tile images ("FrameN: <img>...</img>"), in pixel_values

    def _extra_suppressed_ids(self) -> list[int]:
        ids = self.tokenizer.convert_tokens_to_ids
        proc = self.processor
        return [ids(proc.start_image_token), ids(proc.end_image_token), ids(proc.video_token)]

    @property
    def image_seq_length(self) -> int:
        """Features one tile gives, from the vision config (what the model produces, not what the processor writes)."""
        cfg = self.model.config
        return tokens_per_tile(cfg.vision_config.image_size[0], cfg.vision_config.patch_size[0], cfg.downsample_ratio)

    def tiles_for_images(self, images) -> list[int]:
        """Tiles per image by the image processor's own tiling rule (thumbnail included)."""
        if not images:
            return []
        sizes = [(img.height, img.width) for img in images]
        # The processor's own count (same merged kwargs as its __call__), so the two cannot drift apart.
        return list(self.processor._get_num_multimodal_tokens(image_sizes=sizes)["num_image_patches"])

    def _run_processor(self, texts, images, videos=None, **text_options):
        if len({len(v) for sample in videos or [] for v in sample}) <= 1:
            return super()._run_processor(texts, images, videos, **text_options)
        # The processor stacks a call's videos into one tensor, so clips of different lengths go one sample per call,
        # left-padded together here (only a sample's own videos must agree).
        parts = []
        for i, (text, sample_images, sample_videos) in enumerate(zip(texts, images, videos)):
            if len({len(v) for v in sample_videos}) > 1:
                raise ValueError(f"sample {i}: {self.family}: the videos of one prompt must have the same number of "
                                 f"frames (transformers' InternVL processor stacks them); got {[len(v) for v in sample_videos]}")
            parts.append(super()._run_processor([text], [sample_images], [sample_videos], **text_options))
        width = max(p["input_ids"].shape[1] for p in parts)
        left = [(width - p["input_ids"].shape[1], 0) for p in parts]
        out = {"input_ids": torch.cat([F.pad(p["input_ids"], pad, value=self.pad_token_id) for p, pad in zip(parts, left)]),
               "attention_mask": torch.cat([F.pad(p["attention_mask"], pad) for p, pad in zip(parts, left)])}
        pixels = [p["pixel_values"] for p in parts if "pixel_values" in p]
        return {**out, "pixel_values": torch.cat(pixels)} if pixels else out

    def _to_batch(self, features, images, videos=None) -> PromptBatch:
        mm, mm_rows = {}, {}
        if "pixel_values" in features:
            # Each image's tiles, then (a video's frames are one tile each, merged in prompt order) its frames.
            tiles = sum_per_sample(self.tiles_for_images([img for sample in images for img in sample]),
                                   [len(s) for s in images])
            frames = [sum(len(v) for v in sample) for sample in videos or [[] for _ in images]]
            per_sample = [t + f for t, f in zip(tiles, frames)]
            total = features["pixel_values"].shape[0]
            if sum(per_sample) != total:
                raise ValueError(f"InternVL processor made {total} tiles; its tiling rule says {sum(per_sample)}")
            mm["pixel_values"] = features["pixel_values"]
            mm_rows["pixel_values"] = per_sample
        return self._batch(features, images, mm, mm_rows, videos=videos)

    def feature_counts(self, batch: PromptBatch) -> list[int]:
        # From the tile rows, never from the tokens, so a tampered prompt shows as a mismatch.
        tiles = batch.mm_rows.get("pixel_values", [0] * len(batch))
        return [n * self.image_seq_length for n in tiles]

    def tiles_per_image(self, batch: PromptBatch, sample: int) -> list[int]:
        """Tiles of each image of `sample`, in order; the thumbnail (when present) is the last tile."""
        return [(end - start) // self.image_seq_length for start, end in batch.image_spans[sample]]

    # ---------------------------------------------------------------- attention-map layout
    def image_grid(self, batch: PromptBatch, sample: int, image: int) -> tuple[int, int]:
        """(rows, cols) of the token grid of ONE tile (the same for every tile and image)."""
        side = int(round(self.image_seq_length**0.5))
        return side, side

    def layout_facts(self, batch, sample, image):
        tiles = batch.mm_rows["pixel_values"][sample]  # the sample's tiles (the tests use one image per sample)
        cfg = self.model.config
        side = int(cfg.vision_config.image_size[0] // cfg.vision_config.patch_size[0] * cfg.downsample_ratio)
        return LayoutFacts(tiles=tiles, grid=(side, side))

    def tile_layout(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """(rows, cols) of crops the image processor cuts an image of (height, width) into (1, 1: no split)."""
        from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

        ip = self.processor.image_processor
        kwargs = self.processor._merge_kwargs()["images_kwargs"]  # the processor's own merged settings
        max_patches = kwargs.get("max_patches", ip.max_patches)
        if not kwargs.get("crop_to_patches", ip.crop_to_patches) or max_patches <= 1:
            return 1, 1
        size = kwargs.get("size", ip.size)
        tile_h, tile_w = (size["height"], size["width"]) if isinstance(size, dict) else (size.height, size.width)
        cols, rows = get_optimal_tiled_canvas(
            tuple(image_size), (tile_h, tile_w), kwargs.get("min_patches", ip.min_patches), max_patches
        )
        return rows, cols

    def image_token_positions(self, batch, sample, image, image_size=None):
        """Crops row-major over the image (each a tile token grid, row-major), then the thumbnail over all of it."""
        tokens = self.image_token_indices(batch, sample, image)
        side, _ = self.image_grid(batch, sample, image)
        if len(tokens) == side * side:
            return tiled_cells(tokens, 1, 1, side)
        if image_size is None:
            raise ValueError("InternVL: the crop layout of a tiled image depends on its size; pass image_size")
        rows, cols = self.tile_layout(image_size)
        if (rows * cols + 1) * side * side != len(tokens):
            raise ValueError(f"InternVL: {len(tokens) // (side * side)} tiles in the prompt but the tiling rule gives "
                             f"{rows}x{cols} + thumbnail")
        return tiled_cells(tokens, rows, cols, side)
