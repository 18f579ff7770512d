"""Where a generic model's image tokens sit: spans per image from the model's own feature counts, and a grid
for heatmaps.

Image tokens are handed to images in prompt order, as many per image as the model's image-feature function gives
it, so adjacent images without delimiters and tiled images with layout tokens between their tiles both split
right. The heatmap grid is the most nearly square rows x cols of an image's tokens (tiles are not told apart):
family files that know their tiling lay it out exactly.
"""

from __future__ import annotations

import math

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.image_layout import LayoutFacts, grid_cells


def near_square(n: int) -> tuple[int, int]:
    rows = int(math.isqrt(n))
    while rows > 1 and n % rows:
        rows -= 1
    return max(rows, 1), n // max(rows, 1)


def spans_by_counts(row: list[int], token_id: int, per_image: list[int]) -> list[tuple[int, int]]:
    """One [start, end) per image: its `per_image[k]` image tokens, in prompt order (empty when it has none)."""
    positions = [k for k, tok in enumerate(row) if tok == token_id]
    spans, start = [], 0
    for count in per_image:
        chunk = positions[start : start + count]
        spans.append((chunk[0], chunk[-1] + 1) if chunk else (0, 0))
        start += count
    return spans


class GenericLayout:
    """Span and layout methods of the generic adapter (mixed into it; reads its feature counts)."""

    def per_image_counts(self, batch: PromptBatch, sample: int) -> list[int]:
        keys = [k for k in self.vision_keys() if k in batch.mm]
        if not keys or not batch.images_per_sample[sample]:
            return []
        one = batch.select([sample])
        return self.image_feature_counts(self._unpacked({k: one.mm[k] for k in keys if k in one.mm}))

    def with_image_spans(self, batch: PromptBatch) -> PromptBatch:
        """`batch` with each image's span measured by its feature count (not by runs of placeholder tokens)."""
        spans = []
        for i, row in enumerate(batch.input_ids.tolist()):
            counts = self.per_image_counts(batch, i)
            if len(counts) != batch.images_per_sample[i]:  # the function does not split per image: share evenly
                total, n = sum(counts), batch.images_per_sample[i]
                counts = [total // n] * n if n else []
            spans.append(spans_by_counts(row, self.image_token_id, counts))
        batch.image_spans = spans
        return batch

    def layout_facts(self, batch, sample, image):
        return LayoutFacts(tiles=1, grid=near_square(len(self.image_token_indices(batch, sample, image))))

    def image_token_positions(self, batch, sample, image, image_size=None):
        tokens = self.image_token_indices(batch, sample, image)
        rows, cols = near_square(len(tokens))
        if image_size is not None and rows != cols and (image_size[0] > image_size[1]) != (rows > cols):
            rows, cols = cols, rows  # the longer side of the grid along the longer side of the image
        return grid_cells(tokens, rows, cols)
