"""Image features computed once per unique prompt and shared by every sequence that shows the same images.

A GRPO step has B prompts and G completions each. The vision tower only needs to see each prompt's
images once: `sharing.image_features` encodes the B prompts, `ImageFeatures.select` lays the features out
again for any list of prompt indices (repeats allowed, e.g. `i // G` for every row), and
`sharing.embed_with_features` places them at the image-token positions. Gradients of the gathered rows add
up in the shared features, so a trainable vision tower gets exactly the gradient it would get from encoding
every copy separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class ImageFeatures:
    flat: torch.Tensor  # [sum(counts), D]: every image token's feature, sample after sample, in prompt order
    counts: list[int]  # image features (= image placeholder tokens) of each sample
    # Further per-token features aligned row for row with `flat`, for families that feed image features into
    # later layers too (one [sum(counts), D] tensor per such layer); empty for most families.
    extra: tuple[torch.Tensor, ...] = ()
    # The video features of the same samples, for families whose videos have a token of their own (the Qwen
    # families); frames laid out as images are part of `flat`.
    videos: "ImageFeatures | None" = None

    def __post_init__(self) -> None:
        for tensor in (self.flat, *self.extra):
            if tensor.shape[0] != sum(self.counts):
                raise ValueError(f"{tensor.shape[0]} image features for {sum(self.counts)} image tokens {self.counts}")

    def __len__(self) -> int:
        return len(self.counts)

    def offsets(self) -> list[int]:
        out, total = [], 0
        for n in self.counts:
            out.append(total)
            total += n
        return out

    def _rows(self, indices: Sequence[int]) -> list[int] | None:
        """Feature rows of samples `indices` in that order; None when that is all rows in order (no copy needed)."""
        starts = self.offsets()
        rows = [r for i in indices for r in range(starts[i], starts[i] + self.counts[i])]
        return None if rows == list(range(self.flat.shape[0])) else rows

    def select(self, indices: Sequence[int]) -> "ImageFeatures":
        rows = self._rows(indices)
        counts = [self.counts[int(i)] for i in indices]
        videos = None if self.videos is None else self.videos.select(indices)
        if rows is None:
            return ImageFeatures(self.flat, counts, self.extra, videos)
        index = torch.tensor(rows, dtype=torch.long, device=self.flat.device)
        return ImageFeatures(self.flat.index_select(0, index), counts, tuple(t.index_select(0, index) for t in self.extra),
                             videos)

    def detach(self) -> "ImageFeatures":
        videos = None if self.videos is None else self.videos.detach()
        return ImageFeatures(self.flat.detach(), list(self.counts), tuple(t.detach() for t in self.extra), videos)

    @staticmethod
    def concat(parts: Sequence["ImageFeatures"]) -> "ImageFeatures":
        """The samples of `parts`, one after another (e.g. the prompts' features, then the tool turns')."""
        parts = [p for p in parts if p is not None]
        flat = torch.cat([p.flat for p in parts]) if len(parts) > 1 else parts[0].flat
        extra = tuple(torch.cat(layers) for layers in zip(*(p.extra for p in parts))) if len(parts) > 1 else parts[0].extra
        return ImageFeatures(flat, [n for p in parts for n in p.counts], extra)

    def gather(self, groups: Sequence[Sequence[int]]) -> "ImageFeatures":
        """New samples, sample k holding the features of samples `groups[k]` in that order (a row's prompt, then
        the tool turns that showed it images)."""
        starts = self.offsets()
        rows = [r for group in groups for i in group for r in range(starts[i], starts[i] + self.counts[i])]
        counts = [sum(self.counts[i] for i in group) for group in groups]
        if rows == list(range(self.flat.shape[0])):
            return ImageFeatures(self.flat, counts, self.extra)
        index = torch.tensor(rows, dtype=torch.long, device=self.flat.device)
        return ImageFeatures(self.flat.index_select(0, index), counts, tuple(t.index_select(0, index) for t in self.extra))


def hf_core(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside wrappers: DDP/accelerate (`.module`) and peft (`get_base_model()`).
    LoRA layers injected by peft stay in place (and obey `disable_adapter()`)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def generation_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """The 1-D positions `generate()` uses for a left-padded batch: counted from each row's first real token."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def flatten_pooled(pooled) -> torch.Tensor:
    """`get_image_features(...).pooler_output` (a tensor or a list of per-image tensors) -> [N, D]."""
    if isinstance(pooled, (list, tuple)):
        return torch.cat([p.reshape(-1, p.shape[-1]) for p in pooled], dim=0)
    return pooled.reshape(-1, pooled.shape[-1])


def with_mask_positions(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`inputs` plus the positions generate() uses (from the attention mask): a plain forward would count pads."""
    inputs["position_ids"] = generation_positions(inputs["attention_mask"])
    return inputs
