"""Videos: a clip's sampled frames plus the timing the processors need to write timestamps and temporal positions.

A `Video` is what every family's processor is given: the frames (8-bit RGB PIL images, in order) and where they
came from (the source's frame rate and the index of each sampled frame), which transformers' `VideoMetadata`
carries into the processors (Qwen3-VL and SmolVLM write per-frame timestamps into the prompt; Qwen2.5-VL turns
the rate into seconds per temporal patch for its M-RoPE positions).

Files are decoded with transformers' own `load_video` on the PyAV backend. PyAV's wheels ship FFmpeg; torchcodec,
the default of transformers' video processors and of `datasets.Video`, loads the system's FFmpeg libraries at
import time and fails where none are installed (as here), which a pip install cannot fix.

qwen-vl-utils is not a runtime dependency. Its file readers need torchvision < 0.26 (`io.read_video` is gone from
the torchvision transformers 5.23 runs with), decord, or torchcodec with the system's FFmpeg; its frame sampling (a
rate with min/max frames, a multiple of the temporal patch) and per-frame pixel budget are implemented by
transformers' Qwen video processors (`sample_frames`, `cap_pixels_per_frame`, which cite it as the reference), and
the Qwen adapters use those. The tests check the Qwen frame budget against its `smart_resize` (a dev dependency).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from vlm_grpo.images import BadImage, cap_pixels, prepare

DEFAULT_FRAME_RATE = 2.0  # a list of frames with no rate given: what qwen-vl-utils assumes for frame lists too


class BadVideo(ValueError):
    """A video that cannot be used (unreadable, empty, too many frames); the caller adds which row and field."""


@dataclass
class Video:
    frames: list[Image.Image]
    fps: float = DEFAULT_FRAME_RATE  # frame rate of the source the frames were sampled from
    frame_indices: list[int] = field(default_factory=list)  # index of each frame in the source (default 0, 1, ...)
    total_frames: int | None = None  # frames in the source (default: len(frames))

    def __post_init__(self) -> None:
        if not self.frame_indices:
            self.frame_indices = list(range(len(self.frames)))
        if self.total_frames is None:
            self.total_frames = len(self.frames)

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def timestamps(self) -> list[float]:
        """Seconds into the source of each frame."""
        return [i / self.fps for i in self.frame_indices]

    def metadata(self):
        """transformers' VideoMetadata for the processors (timestamps, seconds per temporal patch)."""
        from transformers.video_utils import VideoMetadata

        height, width = (self.frames[0].height, self.frames[0].width) if self.frames else (None, None)
        return VideoMetadata(total_num_frames=int(self.total_frames), fps=float(self.fps), width=width, height=height,
                             duration=self.total_frames / self.fps, frames_indices=list(self.frame_indices))


def as_video(value) -> Video:
    """A Video, or a list of frames (PIL images) taken as a clip at DEFAULT_FRAME_RATE."""
    if isinstance(value, Video):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(f, Image.Image) for f in value):
        return Video(list(value))
    raise BadVideo(f"must be a Video or a list of PIL frames, got {type(value).__name__}")


def prepare_video(video, max_frames: int | None = None, max_pixels: int | None = None) -> Video:
    """Every frame decoded to 8-bit RGB and capped at `max_pixels`; no frames, or more than `max_frames`, is bad."""
    video = as_video(video)
    if not video.frames:
        raise BadVideo("has no frames")
    if max_frames is not None and len(video) > max_frames:
        raise BadVideo(f"has {len(video)} frames, above the limit of {max_frames} (data.max_video_frames)")
    frames = []
    for k, frame in enumerate(video.frames):
        try:
            frame = prepare(frame)
        except BadImage as err:
            raise BadVideo(f"frame {k} {err}") from None
        frames.append(cap_pixels(frame, max_pixels) if max_pixels else frame)
    if len({f.size for f in frames}) > 1:
        raise BadVideo(f"has frames of different sizes {sorted({f.size for f in frames})}")
    return Video(frames, video.fps, list(video.frame_indices), video.total_frames)


def prepare_sample_video(video, sample: int) -> Video:
    """`prepare_video` for the videos of prompt `sample`; a bad video names its sample."""
    try:
        return prepare_video(video)
    except BadVideo as err:
        raise ValueError(f"sample {sample}: field 'videos': the video {err}") from None


def sample_indices(total: int, source_fps: float, frames: int | None, fps: float | None, max_frames: int) -> list[int]:
    """Uniformly spread frame indices: `frames` of them, or `fps` per second of the source; never above `max_frames`
    nor the source's length."""
    if total < 1:
        raise BadVideo("has no frames")
    if fps:
        count = max(1, int(total / source_fps * fps)) if source_fps else total
    else:
        count = frames or total
    count = min(count, max_frames, total)
    return (np.arange(count) * total // count).astype(int).tolist()


def read_video_file(source: str | Path | bytes, *, frames: int | None = 8, fps: float | None = None,
                    max_frames: int = 16) -> Video:
    """Decode a video file (a path or its bytes) with transformers' `load_video` (PyAV), sampling `frames` frames
    (or `fps` per second), at most `max_frames`."""
    from transformers.video_utils import load_video

    def pick(metadata, **_):
        metadata.fps = metadata.fps or DEFAULT_FRAME_RATE
        return np.array(sample_indices(metadata.total_num_frames, metadata.fps, frames, fps, max_frames))

    data = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source)
    try:
        if isinstance(data, io.BytesIO):  # load_video takes paths and URLs only: decode bytes with its reader
            from transformers.video_utils import read_video_pyav

            array, metadata = read_video_pyav(data, pick)
        else:
            array, metadata = load_video(data, backend="pyav", sample_indices_fn=pick)
    except BadVideo:
        raise
    except Exception as err:  # noqa: BLE001 - FFmpeg raises many kinds for bad data
        raise BadVideo(f"cannot be decoded: {type(err).__name__}: {err}") from None
    if len(array) == 0:
        raise BadVideo("has no frames")
    images = [Image.fromarray(np.asarray(frame, dtype=np.uint8)) for frame in array]
    return Video(images, float(metadata.fps or DEFAULT_FRAME_RATE), [int(i) for i in metadata.frames_indices],
                 int(metadata.total_num_frames))


def count_frames(source: str | Path | bytes) -> int:
    """Frames in a video file, read from its container header (a check before the full decode)."""
    import av

    try:
        with av.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else str(source)) as container:
            if not container.streams.video:
                raise BadVideo("has no video stream")
            stream = container.streams.video[0]
            return int(stream.frames) or sum(1 for _ in container.decode(video=0))
    except BadVideo:
        raise
    except Exception as err:  # noqa: BLE001
        raise BadVideo(f"cannot be read: {type(err).__name__}: {err}") from None
