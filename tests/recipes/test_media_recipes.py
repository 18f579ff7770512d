"""The generated video and several-image recipes: the clip really shows the asked direction, splits differ, the
rewards score what they say, and `compare_counts` interleaves images with text."""

from __future__ import annotations

import numpy as np
import pytest

from vlm_grpo.recipes import compare_counts, moving_square


def red_centre(frame) -> tuple[float, float]:
    pixels = np.asarray(frame).astype(int)
    ys, xs = np.nonzero((pixels[..., 0] > 180) & (pixels[..., 1] < 80))
    return float(xs.mean()), float(ys.mean())


@pytest.mark.parametrize("frames", [4, 8])
def test_the_square_moves_the_asked_way(frames):
    ds = moving_square.build(size=12, video_frames=frames)
    for sample in ds:
        clip = sample.videos[0]
        assert len(clip) == frames and sample.images == [] and sample.prompt[0]["content"][0] == {"type": "video"}
        (x0, y0), (x1, y1) = red_centre(clip.frames[0]), red_centre(clip.frames[-1])
        dx, dy = moving_square.DIRECTIONS[sample.fields["answer"]]
        assert (x1 - x0) * dx > 0 or (y1 - y0) * dy > 0
        assert abs(x1 - x0) * (dx == 0) + abs(y1 - y0) * (dy == 0) < 1e-6  # along one axis only
    test = moving_square.build(split="test", size=12, video_frames=frames)
    assert [s.videos[0].frames[0].tobytes() for s in ds] != [s.videos[0].frames[0].tobytes() for s in test]
    with pytest.raises(ValueError, match="video_frames must be 2..16"):
        moving_square.build(video_frames=1)


def test_moving_square_rewards():
    assert moving_square.correctness(["It goes left, then right.", "up", "no idea"], ["right", "down", "up"]) == [1, 0, 0]
    assert moving_square.answer_format(["Left.", "left or right", "none"]) == [0.2, 0.0, 0.0]


def test_compare_counts_interleaves_and_knows_the_answer():
    ds = compare_counts.build(size=9, mixed_counts=True)
    assert [len(s.images) for s in ds][:3] == [1, 2, 4]
    for sample in ds:
        parts = sample.prompt[0]["content"]
        kinds = [p["type"] for p in parts]
        assert kinds.count("image") == len(sample.images)
        if len(sample.images) > 1:
            assert kinds[:3] == ["text", "image", "text"] and parts[0]["text"] == "Image 1: "
            circles = sample.fields["circles"]
            assert sample.fields["answer"] == compare_counts.ORDINALS[circles.index(max(circles))]
    four = compare_counts.build(size=1, images_per_prompt=4)[0]
    assert "the first, second, third or the fourth" in four.prompt[0]["content"][-1]["text"]
    assert compare_counts.correctness(["The second one.", "first? no, second", "yes"], ["second", "first", "no"]) == [1, 0, 0]
    assert compare_counts.answer_format(["The first.", "first or second"]) == [0.2, 0.0]
