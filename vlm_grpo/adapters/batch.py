"""PromptBatch: prompts encoded once, with the bookkeeping needed to regroup them.

Every family stores its multimodal tensors differently (flat patches for Qwen, tiles for
InternVL, per-sample padded tiles for Idefics3). Instead of teaching the loop each layout,
an adapter records, for every tensor, how many leading rows each sample owns. Grouping a
sample for its G completions, or picking a subset, is then one generic gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch


class ImageTokenMismatch(ValueError):
    """A prompt's image placeholder tokens do not match the image features the model will produce."""


@dataclass
class PromptBatch:
    input_ids: torch.Tensor  # [B, L], left-padded
    attention_mask: torch.Tensor  # [B, L]
    mm: dict[str, torch.Tensor] = field(default_factory=dict)  # family tensors, e.g. pixel_values
    mm_rows: dict[str, list[int]] = field(default_factory=dict)  # rows of mm[key] owned by each sample
    image_spans: list[list[tuple[int, int]]] = field(default_factory=list)  # per sample, per image [start, end)
    token_keys: tuple[str, ...] = ()  # mm keys shaped like input_ids; extended over completions
    # per sample, per video, per frame unit (a frame, or a temporal patch of frames) [start, end); empty: no videos
    video_spans: list[list[list[tuple[int, int]]]] = field(default_factory=list)
    # per-sample bookkeeping a family reads (e.g. each image's tile grid) that the model never sees; rows per
    # sample in `meta_rows`, regrouped like `mm`
    meta: dict[str, torch.Tensor] = field(default_factory=dict)
    meta_rows: dict[str, list[int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def images_per_sample(self) -> list[int]:
        return [len(spans) for spans in self.image_spans]

    @property
    def videos_per_sample(self) -> list[int]:
        return [len(videos) for videos in self.video_spans] if self.video_spans else [0] * len(self)

    def select(self, indices: Sequence[int] | torch.Tensor) -> "PromptBatch":
        """Samples `indices` (repeats allowed), with their multimodal rows."""
        idx = [int(i) for i in indices]
        mm, mm_rows = _gather_rows(self.mm, self.mm_rows, idx)
        meta, meta_rows = _gather_rows(self.meta, self.meta_rows, idx)
        pick = torch.tensor(idx, dtype=torch.long, device=self.input_ids.device)
        return replace(
            self,
            input_ids=self.input_ids[pick],
            attention_mask=self.attention_mask[pick],
            mm=mm,
            mm_rows=mm_rows,
            image_spans=[list(self.image_spans[i]) for i in idx],
            video_spans=[list(self.video_spans[i]) for i in idx] if self.video_spans else [],
            meta=meta,
            meta_rows=meta_rows,
        )

    def repeat(self, num_generations: int) -> "PromptBatch":
        """Each sample `num_generations` times in a row: the layout of a GRPO group."""
        return self.select([i for i in range(len(self)) for _ in range(num_generations)])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> "PromptBatch":
        def move(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point():
                return t.to(device=device, dtype=dtype)
            return t.to(device)

        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            mm={k: move(v) for k, v in self.mm.items()},
        )

    def model_inputs(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, **self.mm}


# New samples made of the images of existing ones: per new sample, (batch, sample index) pairs in order.
ImageSources = Sequence[Sequence[tuple["PromptBatch", int]]]


def sample_rows(batch: PromptBatch, key: str, index: int) -> torch.Tensor:
    """The leading rows of `batch.mm[key]` that sample `index` owns."""
    rows = batch.mm_rows[key]
    start = sum(rows[:index])
    return batch.mm[key][start : start + rows[index]]


def combine_rows(sources: ImageSources, keys: Sequence[str]) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """(mm, mm_rows) for `keys` of samples made of the sources' leading rows, in order (flat layouts)."""
    mm, mm_rows = {}, {}
    for key in keys:
        parts = [[sample_rows(b, key, i) for b, i in group if key in b.mm] for group in sources]
        if not any(parts):
            continue
        mm_rows[key] = [sum(p.shape[0] for p in group) for group in parts]
        mm[key] = torch.cat([p for group in parts for p in group])
    return mm, mm_rows


def sum_per_sample(per_item: list[int], items_per_sample: list[int]) -> list[int]:
    """Per-item counts (e.g. patches per image) summed over each sample's consecutive items."""
    out, pos = [], 0
    for n in items_per_sample:
        out.append(int(sum(per_item[pos : pos + n])))
        pos += n
    return out


def _gather_rows(tensors: dict[str, torch.Tensor], rows_of: dict[str, list[int]], idx: list[int]):
    """The rows samples `idx` own in each tensor, in that order, and their row counts."""
    out, out_rows = {}, {}
    for key, tensor in tensors.items():
        rows = rows_of[key]
        starts = _prefix_sums(rows)
        row_index = [r for i in idx for r in range(starts[i], starts[i] + rows[i])]
        if not row_index:  # e.g. only text-only samples picked: models reject empty image tensors
            continue
        out[key] = tensor[torch.tensor(row_index, dtype=torch.long, device=tensor.device)]
        out_rows[key] = [rows[i] for i in idx]
    return out, out_rows


def _prefix_sums(rows: list[int]) -> list[int]:
    out, total = [], 0
    for r in rows:
        out.append(total)
        total += r
    return out


def visual_parts(prompt: Sequence[dict[str, Any]]) -> list[str]:
    """The kinds ("image" or "video") of the chat messages' visual parts, in prompt order."""
    return [
        part["type"]
        for message in prompt
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, dict) and part.get("type") in ("image", "video")
    ]


def image_parts(prompt: Sequence[dict[str, Any]]) -> int:
    """How many image parts the chat messages hold (the images a sample must come with)."""
    return visual_parts(prompt).count("image")


def video_parts(prompt: Sequence[dict[str, Any]]) -> int:
    """How many video parts the chat messages hold (the videos a sample must come with)."""
    return visual_parts(prompt).count("video")
