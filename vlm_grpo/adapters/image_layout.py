"""Where each image token sits in its image: the geometry behind attention heatmaps.

Every family lays image tokens out differently (Qwen's merged patches, InternVL's crops + thumbnail,
Idefics3's split tiles + global tile, a LLaVA patch grid). An adapter maps each placeholder token to the
rectangle of the original image it encodes (`ImageCell`), so one heatmap code serves them all.
`LayoutFacts` is what a family says about an encoded image, read off the processor's tensors and the
config (never off the token positions), so tests can check the cells against it.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class ImageCell(NamedTuple):
    """One image token and the rectangle of the image it encodes (normalized coordinates, y down)."""

    token_index: int  # position in the prompt's input_ids
    y0: float
    x0: float
    y1: float
    x1: float


class LayoutFacts(NamedTuple):
    """An encoded image's token layout: `tiles` crops (plus one global tile or thumbnail when more than one),
    each a `grid` of (rows, cols) tokens in row-major order. tiles == 1: one grid over the whole image."""

    tiles: int
    grid: tuple[int, int]
    # the global tile's / thumbnail's own (rows, cols) where it differs from a crop's (LFM2-VL keeps the image's
    # aspect in its thumbnail); None: the crops' grid
    global_grid: tuple[int, int] | None = None
    global_first: bool = False  # the global tile's tokens come before the crops' (LLaVA-OneVision's base tile)

    @property
    def crops(self) -> int:
        return self.tiles - 1 if self.tiles > 1 else 1

    @property
    def has_global(self) -> bool:
        return self.tiles > 1


def grid_cells(token_indices: Sequence[int], rows: int, cols: int, box=(0.0, 0.0, 1.0, 1.0)) -> list[ImageCell]:
    """`rows` x `cols` tokens laid out row-major over `box` = (y0, x0, y1, x1)."""
    if len(token_indices) != rows * cols:
        raise ValueError(f"{len(token_indices)} image tokens do not fill a {rows}x{cols} grid")
    y0, x0, y1, x1 = box
    h, w = (y1 - y0) / rows, (x1 - x0) / cols
    return [
        ImageCell(tok, y0 + (k // cols) * h, x0 + (k % cols) * w, y0 + (k // cols + 1) * h, x0 + (k % cols + 1) * w)
        for k, tok in enumerate(token_indices)
    ]


def tiled_cells(token_indices: Sequence[int], crop_rows: int, crop_cols: int, side: int) -> list[ImageCell]:
    """Crops row-major over the image (each `side` x `side` tokens, row-major), then one global tile over all
    of it; a single tile (crop_rows * crop_cols <= 1) is just the global grid."""
    per_tile = side * side
    crops = crop_rows * crop_cols
    if crops <= 1:
        return grid_cells(token_indices, side, side)
    if len(token_indices) != (crops + 1) * per_tile:
        raise ValueError(f"{len(token_indices)} image tokens for {crops} crops + a global tile of {per_tile}")
    cells = []
    for t in range(crops):
        r, c = divmod(t, crop_cols)
        box = (r / crop_rows, c / crop_cols, (r + 1) / crop_rows, (c + 1) / crop_cols)
        cells += grid_cells(token_indices[t * per_tile : (t + 1) * per_tile], side, side, box)
    return cells + grid_cells(token_indices[-per_tile:], side, side)


def token_runs(row: list[int], token_id: int) -> list[tuple[int, int]]:
    """[start, end) of every run of `token_id` in `row`."""
    runs, start = [], None
    for pos, tok in enumerate(row + [None]):
        if tok == token_id and start is None:
            start = pos
        elif tok != token_id and start is not None:
            runs.append((start, pos))
            start = None
    return runs


class OneGridLayout:
    """The attention-map layout (a mixin of an adapter, before VLMAdapter) of a family that lays each image out as one
    grid of tokens, row-major over the whole image (resized, never cropped); the family says the grid's
    (rows, cols) from the processor's tensors in `image_grid(batch, sample, image)`."""

    def layout_facts(self, batch, sample: int, image: int) -> LayoutFacts:
        return LayoutFacts(tiles=1, grid=self.image_grid(batch, sample, image))

    def image_token_positions(self, batch, sample: int, image: int, image_size=None) -> list[ImageCell]:
        rows, cols = self.image_grid(batch, sample, image)
        return grid_cells(self.image_token_indices(batch, sample, image), rows, cols)
