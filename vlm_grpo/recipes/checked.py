"""Samples checked on the way into training: a bad one is named (or skipped), never trained on."""

from __future__ import annotations

import logging
from typing import Any, Callable

from PIL import Image

from vlm_grpo.adapters.batch import image_parts, video_parts
from vlm_grpo.recipes.base import Sample, SampleSource
from vlm_grpo.videos import Video

log = logging.getLogger(__name__)


def _has_text(prompt: list[dict[str, Any]]) -> bool:
    """Some text part is not blank; each part is read only to its first character that is not whitespace."""
    for message in prompt:
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [
            p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"
        ] if isinstance(content, list) else []
        if any(part and not part.isspace() for part in parts):
            return True
    return False


def validate_sample(sample: Any, index: int, no_video_family: str | None = None) -> Sample:
    """Raise ValueError naming the row and field unless `sample` is usable (by `no_video_family`'s model, which
    reads no video, when given)."""
    where = f"row {index}"
    if not isinstance(sample, Sample):
        raise ValueError(f"{where}: expected a Sample, got {type(sample).__name__}")
    if not isinstance(sample.prompt, list) or not all(isinstance(m, dict) and "role" in m for m in sample.prompt):
        raise ValueError(f"{where}: field 'prompt' must be a list of chat messages with a role")
    if not _has_text(sample.prompt):
        raise ValueError(f"{where}: field 'prompt' has no text (empty prompt)")
    if not isinstance(sample.images, list) or not all(isinstance(img, Image.Image) for img in sample.images):
        raise ValueError(f"{where}: field 'images' must be a list of PIL images")
    parts = image_parts(sample.prompt)
    if parts != len(sample.images):
        raise ValueError(f"{where}: field 'images' holds {len(sample.images)} images but the prompt has {parts} image parts")
    if not isinstance(sample.videos, list) or not all(_is_video(v) for v in sample.videos):
        raise ValueError(f"{where}: field 'videos' must be a list of videos (a Video or a list of PIL frames each)")
    parts = video_parts(sample.prompt)
    if parts != len(sample.videos):
        raise ValueError(f"{where}: field 'videos' holds {len(sample.videos)} videos but the prompt has {parts} video parts")
    if sample.videos and no_video_family:
        raise ValueError(f"{where}: field 'videos': {no_video_family} cannot take video (its model reads images only)")
    if not isinstance(sample.fields, dict):
        raise ValueError(f"{where}: field 'fields' must be a mapping")
    return sample


def _is_video(value: Any) -> bool:
    if isinstance(value, Video):
        return bool(value.frames)
    return isinstance(value, list) and bool(value) and all(isinstance(f, Image.Image) for f in value)


class CheckedSource:
    """Wraps a sample source: every sample is validated when taken, and, the first time it is drawn, checked
    against the model by `check_drawn(sample)` (set by the trainer: it encodes and fits the positions); in skip
    mode a bad one is replaced by the next good one and recorded in `skipped` (index -> reason)."""

    def __init__(self, source: SampleSource, on_bad_sample: str = "error",
                 check_drawn: Callable[[Sample], None] | None = None):
        if on_bad_sample not in ("error", "skip"):
            raise ValueError(f"on_bad_sample must be error or skip, not {on_bad_sample!r}")
        self.source = source
        self.on_bad_sample = on_bad_sample
        self.no_video_family: str | None = None  # set by `for_adapter`: its video rows are bad rows
        self.check_drawn = check_drawn
        self.drawn_ok: set[int] = set()  # indices already checked against the model
        # rows the loader already left out, then samples that failed when taken
        self.skipped: dict[int | str, str] = {f"source row {i}": m for i, m in getattr(source, "skipped_rows", {}).items()}

    def __len__(self) -> int:
        return len(self.source)

    def for_adapter(self, adapter) -> "CheckedSource":
        """Rows with a video are bad rows for an adapter whose model reads no video."""
        self.no_video_family = None if getattr(adapter, "takes_video", False) else adapter.family
        return self

    def where(self, index: int) -> str:
        """How messages name sample `index`: the source's own row name when it has one (`data.jsonl: row 7`)."""
        where = getattr(self.source, "where", None)
        return where(index) if where is not None else f"row {index}"

    def _take(self, index: int) -> Sample:
        where = self.where(index)
        try:
            sample = validate_sample(self.source[index], index, self.no_video_family)
            if self.check_drawn is not None and index not in self.drawn_ok:
                self.check_drawn(sample)
                self.drawn_ok.add(index)
            return sample
        except ValueError as err:
            text = str(err)
            if text.startswith(f"row {index}: ") and where != f"row {index}":
                text = text[len(f"row {index}: "):]
            message = text if where in text else f"{where}: {text}"
            raise ValueError(message) from None

    def __getitem__(self, index: int) -> Sample:
        return self.pick(index)[1]

    def pick(self, index: int) -> tuple[int, Sample]:
        """(the index of the sample given, the sample): `index`'s, or in skip mode the next good one's."""
        if self.on_bad_sample == "error":
            return index, self._take(index)
        for offset in range(len(self.source)):
            candidate = (index + offset) % len(self.source)
            if candidate in self.skipped:
                continue
            try:
                return candidate, self._take(candidate)
            except ValueError as err:
                self.skipped[candidate] = str(err)
                log.warning("skipping bad sample (%d so far): %s", len(self.skipped), err)
        raise ValueError(f"every one of the {len(self.source)} samples is bad: {next(iter(self.skipped.values()))}")
