"""The video side of the adapter contract (a mixin of VLMAdapter), with defaults for families that lay frames out
as images. A family whose model reads video sets `takes_video` and accepts `videos=` in `_run_processor` and
`_to_batch`; where videos have tensors and a token of their own it also names them (`video_keys`,
`video_encoder_keys`, `video_token_id`) and counts their features (`video_feature_counts`, `video_units`,
`video_unit_cells`)."""

from __future__ import annotations

from typing import ClassVar

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.image_layout import ImageCell, grid_cells
from vlm_grpo.adapters.visual_spans import split_layouts, video_token_spans
from vlm_grpo.videos import Video


class VideoHooks:
    takes_video: ClassVar[bool] = False
    video_keys: ClassVar[tuple[str, ...]] = ()  # mm keys of videos only (never given to get_image_features)
    video_encoder_keys: ClassVar[tuple[str, ...]] = ()  # those `get_video_features` takes

    @property
    def video_token_id(self) -> int:
        """The placeholder video features replace (default: the image token: frames are laid out as images)."""
        return self.image_token_id

    def video_feature_counts(self, batch: PromptBatch) -> list[int]:
        """Video features per sample for families with a video token of their own (default: none; frames laid out
        as images are counted by `feature_counts`)."""
        return [0] * len(batch)

    def video_units(self, batch: PromptBatch, videos: list[list[Video]]) -> list[list[int]]:
        """Frame units (token groups along time) of each video of each sample (default: one per frame)."""
        return [[len(v) for v in sample] for sample in videos]

    def video_unit_cells(self, batch: PromptBatch, sample: int, video: int, unit: int) -> list[ImageCell]:
        """One ImageCell per placeholder token of one frame unit, over the frame (default: a square grid)."""
        tokens = self.video_token_indices(batch, sample, video, unit)
        side = int(round(len(tokens) ** 0.5))
        return grid_cells(tokens, side, side)

    def video_token_indices(self, batch: PromptBatch, sample: int, video: int, unit: int | None = None) -> list[int]:
        """Positions of a video's placeholder tokens (of one frame unit, or all of them), delimiters skipped."""
        spans = batch.video_spans[sample][video]
        out = []
        for start, end in spans if unit is None else [spans[unit]]:
            ids = batch.input_ids[sample, start:end].tolist()
            out += [start + k for k, tok in enumerate(ids) if tok == self.video_token_id]
        return out

    def _visual_spans(self, batch: PromptBatch, kinds: list[list[str]], videos: list[list[Video]]):
        """(image spans, per-video frame-unit spans) of every sample (see visual_spans.py)."""
        units = self.video_units(batch, videos)
        rows = batch.input_ids.tolist()
        if self.video_token_id == self.image_token_id:  # frames laid out as images
            layouts = self.image_token_spans(batch.input_ids, [k.count("image") + sum(u) for k, u in zip(kinds, units)])
            split = [split_layouts(lay, k, u, i, self.family) for i, (lay, k, u) in enumerate(zip(layouts, kinds, units))]
            return [s[0] for s in split], [s[1] for s in split]
        image_spans = self.image_token_spans(batch.input_ids, [k.count("image") for k in kinds])
        return image_spans, [video_token_spans(row, self.video_token_id, u, i, self.family)
                             for i, (row, u) in enumerate(zip(rows, units))]
