"""Attention maps land on the right place of the image, for every family's layout.

The expected grid comes from each family's `layout_facts` (tile count and per-tile token grid, read off the
processor output and the config) and the image's orientation, independently of `image_token_positions`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.adapters.samples import picture, user_turn
from tests.conftest import families_with, families_without, tiny_adapter
from vlm_grpo.inspect.attention import (
    _attn_tree,
    answer_attention,
    attention_to_heatmap,
    heatmap_grid_shape,
    render_attention,
)

SHAPES = {"wide": (112, 56), "tall": (56, 112)}  # PIL (width, height)


@pytest.fixture(params=families_without("cross_attention"))
def family(request) -> str:
    """Families whose images are tokens of the sequence: their attention to the image is attention to those tokens."""
    return request.param


@pytest.mark.parametrize("name", families_with("cross_attention"))
def test_cross_attention_families_refuse_token_attention_maps(name):
    adapter = tiny_adapter(name)
    with pytest.raises(ValueError, match="cross-attention"):
        answer_attention(adapter, picture(56, 56, 1), "Where is the square?", max_new_tokens=2)


def expected_layout(adapter, batch, orientation: str):
    """(crop_rows, crop_cols, side_rows, side_cols, has_global, global tokens before the crops) from what the family
    declares about the encoded image (`layout_facts`: tile count and per-tile grid read off the processor tensors)
    and its orientation."""
    facts = adapter.layout_facts(batch, 0, 0)
    rows, cols = (1, facts.crops) if orientation == "wide" else (facts.crops, 1)
    gr, gc = facts.global_grid or facts.grid
    return rows, cols, facts.grid[0], facts.grid[1], facts.has_global, gr * gc if facts.global_first else 0


def token_order(layout, r: int, c: int) -> int:
    """Index among the image's tokens of the token whose patch is fine-grid cell (r, c): crops row-major,
    each crop's tokens row-major (after the global tile's where it comes first)."""
    crop_rows, crop_cols, sr, sc, _, before = layout
    crop = (r // sr) * crop_cols + (c // sc)
    return before + crop * sr * sc + (r % sr) * sc + (c % sc)


def encoded(adapter, orientation):
    w, h = SHAPES[orientation]
    image = picture(w, h, 3)
    batch = adapter.encode_prompts([user_turn(1, "Where is the square?")], [[image]])
    return image, batch


@pytest.mark.parametrize("orientation", ["wide", "tall"])
def test_heatmap_has_the_image_grid_and_covers_the_image(adapter, orientation):
    image, batch = encoded(adapter, orientation)
    layout = expected_layout(adapter, batch, orientation)
    crop_rows, crop_cols, sr, sc, has_global, before = layout
    cells = adapter.image_token_positions(batch, 0, 0, image_size=(image.height, image.width))
    start, end = batch.image_spans[0][0]
    region_tokens = adapter.image_token_indices(batch, 0, 0)  # image tokens that cover part of the image
    assert set(region_tokens) <= set((batch.input_ids[0] == adapter.image_token_id).nonzero().flatten().tolist())
    assert all(start <= t < end for t in region_tokens)
    assert [c.token_index for c in cells] == region_tokens
    assert heatmap_grid_shape(cells) == (crop_rows * sr, crop_cols * sc)
    for c in cells:
        assert 0.0 <= c.y0 < c.y1 <= 1.0 and 0.0 <= c.x0 < c.x1 <= 1.0
    # The crops tile the image exactly once; a global tile / thumbnail covers it once more.
    area = sum((c.y1 - c.y0) * (c.x1 - c.x0) for c in cells)
    assert area == pytest.approx(1.0 + has_global)
    uniform = attention_to_heatmap(np.ones(len(cells)), cells)
    assert uniform.shape == (crop_rows * sr, crop_cols * sc)
    assert (uniform > 0).all()
    assert uniform.sum() == pytest.approx(len(cells))  # mass preserved


@pytest.mark.parametrize("orientation", ["wide", "tall"])
def test_planted_attention_lights_up_its_cell(adapter, orientation):
    image, batch = encoded(adapter, orientation)
    layout = expected_layout(adapter, batch, orientation)
    crop_rows, crop_cols, sr, sc, has_global, before = layout
    rows, cols = crop_rows * sr, crop_cols * sc
    cells = adapter.image_token_positions(batch, 0, 0, image_size=(image.height, image.width))
    planted = np.zeros((rows * cols, len(cells)))
    for r in range(rows):
        for c in range(cols):
            planted[r * cols + c, token_order(layout, r, c)] = 1.0
    maps = attention_to_heatmap(planted, cells)
    for r in range(rows):
        for c in range(cols):
            hm = maps[r * cols + c]
            assert np.unravel_index(hm.argmax(), hm.shape) == (r, c)
            assert hm[r, c] == pytest.approx(1.0)
    if has_global:  # a thumbnail token spreads over its block of the whole image
        gr, gc = adapter.layout_facts(batch, 0, 0).global_grid or (sr, sc)
        first_global = 0 if before else crop_rows * crop_cols * sr * sc
        one_hot = np.zeros(len(cells))
        one_hot[first_global + gc - 1] = 1.0  # thumbnail token (0, last column)
        hm = attention_to_heatmap(one_hot, cells)
        block_r, block_c = rows // gr, cols // gc
        lit = np.zeros((rows, cols), dtype=bool)
        lit[:block_r, cols - block_c :] = True
        assert (hm[lit] > 0).all() and (hm[~lit] == 0).all()
        assert hm.sum() == pytest.approx(1.0)


def _plant_hook(adapter, nth_image_token: int):
    """Make the model's returned attention put all mass on the nth image token of the sequence."""

    def hook(module, args, kwargs, output):
        if not kwargs.get("output_attentions"):
            return output
        ids = kwargs["input_ids"][0]
        key = int((ids == adapter.image_token_id).nonzero()[nth_image_token])
        planted = []
        for att in output.attentions:
            fake = torch.zeros_like(att)
            fake[..., key] = 1.0
            planted.append(fake)
        output.attentions = tuple(planted)
        return output

    return adapter.model.register_forward_hook(hook, with_kwargs=True)


def test_answer_attention_end_to_end_finds_the_planted_token(family, tmp_path):
    adapter = tiny_adapter(family)
    image, batch = encoded(adapter, "wide")
    layout = expected_layout(adapter, batch, "wide")
    rows, cols = layout[0] * layout[2], layout[1] * layout[3]
    target = (0, cols - 1)  # top-right patch
    before = _attn_tree(adapter.model.config)
    handle = _plant_hook(adapter, token_order(layout, *target))
    try:
        maps = answer_attention(adapter, image, "Where is the square?", max_new_tokens=3, layer=-1)
    finally:
        handle.remove()
    assert _attn_tree(adapter.model.config) == before  # attention implementation restored
    assert maps.heatmaps.shape[1:] == (rows, cols)
    assert 1 <= len(maps.tokens) <= 3 and maps.heatmaps.shape[0] == len(maps.tokens)
    for hm in [*maps.heatmaps, maps.mean_heatmap]:
        assert np.unravel_index(hm.argmax(), hm.shape) == target
    assert maps.image_share == pytest.approx(np.ones(len(maps.tokens)))
    out = render_attention(maps, tmp_path / "att.png")
    from PIL import Image

    with Image.open(out) as png:
        assert png.format == "PNG" and png.width >= 200 and png.height >= 150


def test_real_attention_is_a_distribution_over_the_sequence():
    adapter = tiny_adapter("qwen2_5_vl")
    image, batch = encoded(adapter, "wide")
    maps = answer_attention(adapter, image, "Where is the square?", max_new_tokens=3)
    assert ((maps.image_share > 0) & (maps.image_share < 1)).all()
    assert maps.heatmaps.sum(axis=(1, 2)) == pytest.approx(maps.image_share, rel=1e-5)
    with pytest.raises(ValueError, match="layer"):
        answer_attention(adapter, image, "x", max_new_tokens=1, layer=99)
