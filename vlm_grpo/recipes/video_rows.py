"""Videos in dataset rows: a list of frames (each anything an image column takes) or a video file (a path, its
bytes, or the hub's `{"bytes", "path"}` record), checked when the set is built and decoded when a sample is taken.

Checked up front: a file opens and holds frames (its container header, not a full decode); a list of frames is
not empty, each frame is a readable image, and there are no more than `max_video_frames`. A file is sampled down
to `video_frames` frames (or `video_fps` per second), never above `max_video_frames`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_grpo.recipes.rows import ImageRef, RowChecker
from vlm_grpo.videos import DEFAULT_FRAME_RATE, BadVideo, Video, count_frames, prepare_video, read_video_file


@dataclass(frozen=True)
class VideoSettings:
    """The data settings that shape a video (data.video_frames, video_fps, max_video_frames, video_max_pixels)."""

    frames: int = 8
    fps: float = 0.0
    max_frames: int = 16
    max_pixels: int = 224 * 224


@dataclass
class VideoRef:
    """A video to decode when the sample is taken: frames (ImageRefs) or a file (path or bytes)."""

    frames: list[ImageRef] = field(default_factory=list)
    path: Path | None = None
    data: bytes | None = None
    where: str = "video"

    def load(self, settings: VideoSettings) -> Video:
        try:
            if self.frames:
                video = Video([ref.load() for ref in self.frames], settings.fps or DEFAULT_FRAME_RATE)
            else:
                source = self.data if self.data is not None else self.path
                video = read_video_file(source, frames=settings.frames, fps=settings.fps or None,
                                        max_frames=settings.max_frames)
            return prepare_video(video, settings.max_frames, settings.max_pixels)
        except BadVideo as err:
            raise ValueError(f"{self.where}: the video {err}") from None


def check_video(checker: RowChecker, index: int, name: str, value: Any, settings: VideoSettings) -> VideoRef:
    """One video of a row, checked; `name` is the field as messages show it (`video`, `videos[1]`)."""
    where = f"{checker.source}: row {index}: field {name!r}"
    if isinstance(value, (list, tuple)):
        if not value:
            raise checker.fail(index, name, "is an empty list of frames")
        if len(value) > settings.max_frames:
            raise checker.fail(index, name, f"has {len(value)} frames, above the limit of {settings.max_frames} "
                               "(data.max_video_frames)")
        frames = [checker.image(index, {f"{name}[{k}]": f}, (f"{name}[{k}]",)) for k, f in enumerate(value)]
        return VideoRef(frames=frames, where=where)
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
        if value is None:
            raise checker.fail(index, name, "is a video mapping with neither bytes nor path")
    if isinstance(value, (bytes, bytearray)):
        ref = VideoRef(data=bytes(value), where=where)
    elif isinstance(value, (str, Path)):
        resolve = checker._resolve if checker.hub_id is None else checker._dataset_file
        ref = VideoRef(path=resolve(index, name, value), where=where)
    else:
        raise checker.fail(index, name, f"must be a list of frames or a video file (path or bytes), got "
                           f"{type(value).__name__}")
    try:
        if count_frames(ref.data if ref.data is not None else ref.path) < 1:
            raise BadVideo("has no frames")
    except BadVideo as err:
        shown = f" ({ref.path})" if ref.path else ""
        raise checker.fail(index, name, f"is not a readable video{shown}: {err}") from None
    return ref


def check_videos(checker: RowChecker, index: int, row: dict, settings: VideoSettings) -> tuple[str | None, list[VideoRef]]:
    """(the video column, its videos): `videos` (a list of videos) or `video` (one); none when the row has neither."""
    if row.get("videos") is not None:
        value = row["videos"]
        if not isinstance(value, list):
            raise checker.fail(index, "videos", f"must be a list of videos, got {type(value).__name__}")
        return "videos", [check_video(checker, index, f"videos[{k}]", v, settings) for k, v in enumerate(value)]
    if row.get("video") is not None:
        return "video", [check_video(checker, index, "video", row["video"], settings)]
    return None, []
