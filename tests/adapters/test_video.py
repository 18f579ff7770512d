"""Video in the adapter contract, on every family whose model reads video (a new family that sets `takes_video` is
picked up): video tokens = video features, frame spans, teacher-forced log-probs = generation and = the shared
feature forward, each video encoded once per group, the cache probe with a video prompt (and its simulated fault),
and a family without video refusing in one line."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from tests.adapters.samples import picture
from tests.conftest import tiny_adapter
from vlm_grpo.adapters.base import VideoNotSupported
from vlm_grpo.adapters.registry import families, image_families
from vlm_grpo.adapters.sharing import embed_with_features, generate_shared, image_features, text_side
from vlm_grpo.adapters.teacher_forcing import completion_logits
from vlm_grpo.compat.cache_probe import probe_cache
from vlm_grpo.compat.simulated_faults import simulated_fault
from vlm_grpo.grpo.logprobs.completions import completion_logprobs, token_logprobs
from vlm_grpo.grpo.training.vision_counter import VisionCounter
from vlm_grpo.videos import Video

VIDEO_FAMILIES = sorted(name for name, cls in families().items() if cls.takes_video)
NO_VIDEO_FAMILIES = sorted(name for name, cls in image_families().items() if not cls.takes_video)
FRAMES = 4


def clip(seed: int, frames: int = FRAMES, size: int = 56) -> Video:
    """A square sliding right over a seed-coloured picture."""
    base = picture(size, size, seed)
    out = []
    for t in range(frames):
        frame = base.copy()
        frame.paste((20, 20, 20), (t * 8, 20, t * 8 + 12, 32))
        out.append(frame)
    return Video(out, fps=2.0)


def turn(text: str, images: int = 0, videos: int = 1) -> list[dict]:
    parts = [{"type": "image"}] * images + [{"type": "text", "text": "and "}] * bool(images) + [{"type": "video"}] * videos
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def video_batch(adapter):
    """2 samples: a video; two videos (or, where the family can mix them in one batch, an image and a video)."""
    mixes = adapter.family != "smolvlm"  # transformers' SmolVLM processor cannot take both in one call
    second = (turn("Which way?", images=1), [picture(56, 56, 9)], [clip(2)]) if mixes else \
        (turn("Which way?", videos=2), [], [clip(2), clip(3)])
    conversations = [turn("What moves?"), second[0]]
    return adapter.encode_prompts(conversations, [[], second[1]], [[clip(1)], second[2]])


@pytest.fixture(params=VIDEO_FAMILIES)
def video_adapter(request):
    return tiny_adapter(request.param)


def test_video_tokens_equal_features_and_frame_spans(video_adapter):
    adapter = video_adapter
    batch = video_batch(adapter)  # encode_prompts checks tokens = features, for images and videos
    assert batch.videos_per_sample == [1, 1 if adapter.family != "smolvlm" else 2]
    for sample, videos in enumerate(batch.video_spans):
        for v, units in enumerate(videos):
            tokens = adapter.video_token_indices(batch, sample, v)
            assert tokens and all(batch.input_ids[sample, t] == adapter.video_token_id for t in tokens)
            assert len(units) in (FRAMES, FRAMES // 2)  # a frame each, or a temporal patch of 2 (Qwen)
            cells = [c for u in range(len(units)) for c in adapter.video_unit_cells(batch, sample, v, u)]
            assert [c.token_index for c in cells] == tokens  # every video token has its place on a frame
    # a video token more than the video gives is caught and named
    tampered = batch.select([0])
    pos = adapter.video_token_indices(tampered, 0, 0)[0]
    tampered.input_ids = torch.cat([tampered.input_ids[:, :pos + 1], tampered.input_ids[:, pos:]], dim=1)
    tampered.attention_mask = torch.ones_like(tampered.input_ids)
    with pytest.raises(ValueError, match="sample 0"):
        adapter.check_alignment(tampered)


def test_video_logprobs_teacher_forced_equal_generation_and_shared_features(video_adapter):
    adapter = video_adapter
    batch = video_batch(adapter)
    grouped = batch.repeat(2)
    out = adapter.generate(grouped, max_new_tokens=4, min_new_tokens=4, output_logits=True)
    completion = out.sequences[:, grouped.input_ids.shape[1]:]
    ones = torch.ones_like(completion)
    with torch.no_grad():
        forward = completion_logprobs(adapter, grouped, completion, ones)
        full = completion_logits(adapter, grouped, completion, ones)
        features = image_features(adapter, batch).select([0, 0, 1, 1])  # each prompt's video encoded once
        inputs = embed_with_features(adapter, text_side(adapter, grouped), features, completion, ones)
        shared = completion_logits(adapter, grouped, completion, ones, inputs=inputs)
    assert (forward - token_logprobs(torch.stack(out.logits, dim=1), completion)).abs().max().item() <= 1e-4
    assert (shared - full).abs().max().item() <= 1e-4
    # the video matters: another clip moves the logits
    other = adapter.encode_prompts([turn("What moves?")], [[]], [[clip(7)]])
    with torch.no_grad():
        moved = completion_logits(adapter, other, completion[:1], ones[:1])
    assert (moved - full[:1]).abs().max().item() > 1e-3


def test_each_video_is_encoded_once_per_group(video_adapter):
    adapter = video_adapter
    batch = video_batch(adapter)
    with VisionCounter(adapter, [adapter.model]) as counter:
        features = image_features(adapter, batch)
        generate_shared(adapter, batch, 4, features=features, max_new_tokens=2)
    separate = adapter.video_token_id != adapter.image_token_id  # videos with tensors and a token of their own
    videos, images = sum(batch.videos_per_sample), sum(batch.images_per_sample)  # a 56-px image is one tile
    assert counter.calls == (2 if separate and images else 1)  # image and video encoders apart, never per completion
    assert counter.images == (videos if separate else videos * FRAMES) + images  # a grid row, or a tile per frame


def test_cache_probe_with_a_video_prompt_passes_and_catches_the_video_fault(video_adapter):
    report = probe_cache(video_adapter, steps=3, media="video")
    assert report.cache_ok and not report.blind and "other video" in report.table(), report.table()
    with simulated_fault(video_adapter, "drop_video"):
        faulty = probe_cache(video_adapter, steps=3, media="video")
    assert not faulty.cache_ok and faulty.path_ok(False), faulty.table()


@pytest.mark.parametrize("family", NO_VIDEO_FAMILIES)
def test_a_family_without_video_refuses_in_one_line(family):
    adapter = tiny_adapter(family)
    with pytest.raises(VideoNotSupported, match=rf"^sample 0: {family} cannot take video[^\n]*$"):
        adapter.encode_prompts([turn("What moves?")], [[]], [[clip(1)]])
    with pytest.raises(ValueError, match="cannot take video"):
        probe_cache(adapter, steps=2, media="video")


def test_frames_must_agree_in_size_and_be_present():
    adapter = tiny_adapter(VIDEO_FAMILIES[0])
    with pytest.raises(ValueError, match="sample 0: field 'videos': the video has no frames"):
        adapter.encode_prompts([turn("?")], [[]], [[Video([])]])
    odd = Video([Image.new("RGB", (56, 56)), Image.new("RGB", (28, 56))])
    with pytest.raises(ValueError, match="frames of different sizes"):
        adapter.encode_prompts([turn("?")], [[]], [[odd]])


@pytest.mark.parametrize("size", [(56, 56), (90, 130), (200, 60)])
def test_qwen_frame_pixel_budget_is_qwen_vl_utils(size):
    """The Qwen2.5-VL video processor (cap_pixels_per_frame) resizes frames as qwen-vl-utils, the reference Qwen users
    run, budgets them (an independent implementation: its `smart_resize`)."""
    from qwen_vl_utils import smart_resize

    adapter = tiny_adapter("qwen2_5_vl")
    width, height = size
    frames = Video([Image.new("RGB", (width, height), (k * 40, 90, 30)) for k in range(4)])
    batch = adapter.encode_prompts([turn("?")], [[]], [[frames]])
    _, rows, cols = batch.mm["video_grid_thw"][0].tolist()
    vp = adapter.processor.video_processor
    patch = vp.patch_size
    expected = smart_resize(height, width, factor=patch * vp.merge_size, min_pixels=vp.size.shortest_edge,
                            max_pixels=vp.size.longest_edge)
    assert (rows * patch, cols * patch) == expected


def test_clips_of_different_lengths_share_a_batch(video_adapter):
    """Videos of 2 and 4 frames in one batch (InternVL's processor stacks a call's videos: it encodes them apart)."""
    adapter = video_adapter
    batch = adapter.encode_prompts([turn("What moves?"), turn("And here?")], [[], []], [[clip(1, 2)], [clip(2, 4)]])
    units = [len(batch.video_spans[i][0]) for i in range(2)]
    assert units in ([2, 4], [1, 2])  # frames, or temporal patches of 2
    alone = adapter.encode_prompts([turn("What moves?")], [[]], [[clip(1, 2)]])
    tokens = len(adapter.video_token_indices(alone, 0, 0))
    assert tokens and tokens == len(adapter.video_token_indices(batch, 0, 0))
