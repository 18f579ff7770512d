"""Heatmaps over the frames of a video, on every family that takes video: each frame unit's cells cover its frame,
the answer's attention on the video is split over the units without loss, and the rendered PNG is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.adapters.test_video import VIDEO_FAMILIES, clip
from tests.conftest import tiny_adapter
from vlm_grpo.inspect.attention import heatmap_grid_shape
from vlm_grpo.inspect.video_attention import render_video_attention, video_attention


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_heatmaps_over_frames(family, tmp_path):
    adapter = tiny_adapter(family)
    video = clip(1, frames=4)
    maps = video_attention(adapter, video, "Which way does the square move?", max_new_tokens=3)
    units = len(maps.heatmaps)
    assert units in (4, 2)  # a unit per frame, or per temporal patch of 2 (Qwen)
    assert sorted(f for frames in maps.unit_frames for f in frames) == [0, 1, 2, 3]
    # mass preserved: each unit's heatmap sums to the attention its tokens got
    assert np.allclose(maps.heatmaps.sum(axis=(1, 2)), maps.unit_share, atol=1e-5)
    assert 0 < maps.unit_share.sum() < 1
    out = render_video_attention(maps, tmp_path / "frames.png")
    assert out.stat().st_size > 1000


def test_unit_cells_tile_each_frame_once():
    for family in VIDEO_FAMILIES:
        adapter = tiny_adapter(family)
        batch = adapter.encode_prompts([[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]}]],
                                       [[]], [[clip(2)]])
        for unit in range(len(batch.video_spans[0][0])):
            cells = adapter.video_unit_cells(batch, 0, 0, unit)
            area = sum((c.y1 - c.y0) * (c.x1 - c.x0) for c in cells)
            assert abs(area - 1.0) < 1e-6, family  # the unit's tokens cover its frame exactly once
            rows, cols = heatmap_grid_shape(cells)
            assert rows * cols == len(cells), family
            assert torch.all(batch.input_ids[0, [c.token_index for c in cells]] == adapter.video_token_id)
