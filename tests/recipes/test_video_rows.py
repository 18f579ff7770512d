"""Videos in TRL-format rows: `video` (a list of frames or a video file) and `videos`; frame sampling and pixel caps
from the data settings; bad videos named by row and field and skippable; a video row refused, by row, for a family
without video; every video family encodes a row read from a file."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_adapter
from tests.recipes.helpers import save_image, write_clip, write_jsonl
from vlm_grpo.adapters.registry import families, image_families
from vlm_grpo.recipes.checked import CheckedSource
from vlm_grpo.recipes.trl_format import build
from vlm_grpo.videos import Video, read_video_file

VIDEO_FAMILIES = sorted(name for name, cls in families().items() if cls.takes_video)


def rows(folder) -> list[dict]:
    frames = [save_image(folder / f"f{i}.png", i).name for i in range(4)]
    write_clip(folder / "clip.mp4", frames=6)
    return [
        {"prompt": "Which way does the bar move?", "video": frames, "solution": "right"},
        {"prompt": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Then "},
                                                 {"type": "video"}, {"type": "text", "text": "Same?"}]}],
         "videos": ["clip.mp4", frames[:2]], "solution": "no"},
        {"prompt": "A picture and a clip.", "image": frames[0], "video": "clip.mp4", "solution": "yes"},
        {"prompt": "Two clips: the same?", "videos": ["clip.mp4", frames], "solution": "yes"},
    ]


def test_video_rows_become_clips(tmp_path):
    path = write_jsonl(tmp_path / "v.jsonl", rows(tmp_path))
    ds = build(path=str(path), video_frames=4)
    first, second, third = ds[0], ds[1], ds[2]
    assert [len(v) for v in first.videos] == [4] and first.images == []
    assert first.prompt[0]["content"][0] == {"type": "video"}
    assert [len(v) for v in second.videos] == [4, 2]  # the file sampled to data.video_frames, the frame list as is
    clip = second.videos[0]
    assert clip.total_frames == 6 and clip.fps == pytest.approx(4.0) and clip.frame_indices == [0, 1, 3, 4]
    assert clip.timestamps == pytest.approx([0.0, 0.25, 0.75, 1.0])
    assert [p["type"] for p in third.prompt[0]["content"]] == ["image", "video", "text"]
    assert "video" not in third.fields and "videos" not in second.fields and third.fields["solution"] == "yes"
    # frames per second instead of a count; the frame-size cap
    by_rate = build(path=str(path), video_fps=2.0, video_max_pixels=24 * 24)[1].videos[0]
    assert len(by_rate) == 3 and by_rate.frames[0].size == (24, 24)


def test_the_decoder_reads_what_was_written(tmp_path):
    clip = read_video_file(write_clip(tmp_path / "c.mp4", frames=6, size=48), frames=6)
    columns = [max(range(48), key=lambda x: clip.frames[t].getpixel((x, 24))[0]) for t in range(6)]
    assert columns == sorted(columns) and columns[0] < 8 and columns[-1] >= 40  # the bar slides right, frame by frame


BAD = [
    ({"prompt": "?", "video": []}, "video", "is an empty list of frames"),
    ({"prompt": "?", "video": "garbage.mp4"}, "video", "is not a readable video"),
    ({"prompt": "?", "video": "missing.mp4"}, "video", "names an image file that does not exist"),
    ({"prompt": "?", "video": ["f0.png"] * 5}, "video", "has 5 frames, above the limit of 4 \\(data.max_video_frames\\)"),
    ({"prompt": "?", "videos": ["clip.mp4", []]}, r"videos\[1\]", "is an empty list of frames"),
    ({"prompt": [{"role": "user", "content": [{"type": "text", "text": "?"}]}], "video": ["f0.png"]}, "prompt",
     "has 0 video parts but the row has 1 videos"),
]


@pytest.mark.parametrize("row, field, problem", BAD, ids=[b[2][:24] for b in BAD])
def test_a_bad_video_names_source_row_and_field(tmp_path, row, field, problem):
    rows(tmp_path)
    (tmp_path / "garbage.mp4").write_bytes(b"not a video at all" * 10)
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Fine.", "video": ["f0.png"]}, row])
    with pytest.raises(ValueError, match=rf"d.jsonl: row 1: field '{field}' {problem}"):
        build(path=str(path), max_video_frames=4)
    assert len(build(path=str(path), max_video_frames=4, on_bad_sample="skip")) == 1  # skipped when asked


def test_a_video_row_for_a_family_without_video_is_a_named_bad_row(tmp_path):
    path = write_jsonl(tmp_path / "v.jsonl", rows(tmp_path)[:1] + [{"prompt": "Colour?", "image": "f0.png"}])
    no_video = next(name for name, cls in image_families().items() if not cls.takes_video)
    data = CheckedSource(build(path=str(path)), "error").for_adapter(tiny_adapter(no_video))
    with pytest.raises(ValueError, match=rf"row 0: field 'videos': {no_video} cannot take video"):
        data[0]
    skipping = CheckedSource(build(path=str(path)), "skip").for_adapter(tiny_adapter(no_video))
    assert skipping[0].images and not skipping[0].videos and 0 in skipping.skipped
    video = next(name for name, cls in families().items() if cls.takes_video)
    assert CheckedSource(build(path=str(path)), "error").for_adapter(tiny_adapter(video))[0].videos


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_every_video_family_encodes_a_trl_video_row(family, tmp_path):
    adapter = tiny_adapter(family)
    # two videos of 4 frames (InternVL's processor stacks a batch's videos: their frame counts must agree)
    sample = build(path=str(write_jsonl(tmp_path / "v.jsonl", rows(tmp_path))), video_frames=4)[3]
    assert all(isinstance(v, Video) for v in sample.videos)
    batch = adapter.encode_prompts([sample.prompt], [sample.images], [sample.videos])
    assert batch.videos_per_sample == [2]
    out = adapter.generate(batch, max_new_tokens=2)
    assert out.sequences.shape[1] == batch.input_ids.shape[1] + 2
