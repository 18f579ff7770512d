"""Where does the model look in a video? The answer's attention, frame by frame, mapped onto each frame.

The same teacher-forced eager forward as for an image (inspect/attention.py), over a prompt with one video. Each
frame unit (a frame, or a temporal patch of frames where the model groups them) has its tokens placed on the frame by
`adapter.video_unit_cells`, so every video family lands on one grid per unit: which frames the answer reads, and
where in each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.inspect.attention import _clip, answer_rows, attention_to_heatmap, heatmap_grid_shape
from vlm_grpo.videos import Video, as_video


@dataclass
class VideoAttentionMaps:
    video: Video
    prompt: str
    tokens: list[str]  # generated tokens
    unit_frames: list[list[int]]  # the frames (indices into video.frames) each frame unit encodes
    heatmaps: np.ndarray  # [U, rows, cols]: the answer's mean attention per cell of each unit's frame
    unit_share: np.ndarray  # [U]: the answer's mean attention on each unit's tokens (0..1)
    layer: int | None

    @property
    def answer(self) -> str:
        return "".join(self.tokens)


def video_attention(adapter: VLMAdapter, video, prompt: str, *, max_new_tokens: int = 16,
                    layer: int | None = None) -> VideoAttentionMaps:
    """Greedy answer to (video, prompt), then its attention over each frame unit, as one heatmap per unit."""
    model = adapter.model
    param = next(model.parameters())
    conversation = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": prompt}]}]
    batch = adapter.encode_prompts([conversation], [[]], [[as_video(video)]])
    batch = batch.to(param.device, param.dtype if param.dtype.is_floating_point else None)
    rows, completion = answer_rows(adapter, batch, max_new_tokens=max_new_tokens, layer=layer)
    units = len(batch.video_spans[0][0])
    cells = [adapter.video_unit_cells(batch, 0, 0, u) for u in range(units)]
    shape = max((heatmap_grid_shape(c) for c in cells), key=lambda s: s[0] * s[1])
    heatmaps, shares = [], []
    for unit_cells in cells:
        keys = torch.tensor([c.token_index for c in unit_cells], device=rows.device)
        heatmaps.append(attention_to_heatmap(rows[:, keys], unit_cells, shape).mean(axis=0))
        shares.append(float(rows[:, keys].sum(-1).mean()))
    clip = as_video(video)
    per_unit = max(1, -(-len(clip) // units))  # frames per unit (the last may be padded by the processor)
    unit_frames = [list(range(u * per_unit, min(len(clip), (u + 1) * per_unit))) or [len(clip) - 1]
                   for u in range(units)]
    tokens = [adapter.tokenizer.decode([t]) for t in completion[0].tolist()]
    return VideoAttentionMaps(clip, prompt, tokens, unit_frames, np.stack(heatmaps), np.array(shares), layer)


def render_video_attention(maps: VideoAttentionMaps, out: str | Path, *, panel_size: float = 2.2, dpi: int = 90) -> Path:
    """A row of frame panels: each unit's first frame under its heatmap, titled with its share of the attention."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(maps.heatmaps)
    ncols = min(8, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size * ncols + 0.8, panel_size * nrows + 1.0), squeeze=False,
                             layout="constrained")
    for ax in axes.flat:
        ax.axis("off")
    hi = max(float(maps.heatmaps.max()), 1e-12)
    shown = None
    for ax, frames, hm, share in zip(axes.flat, maps.unit_frames, maps.heatmaps, maps.unit_share):
        frame = maps.video.frames[frames[0]]
        w, h = frame.size
        ax.imshow(frame, extent=(0, w, h, 0))
        shown = ax.imshow(hm, extent=(0, w, h, 0), cmap="inferno", alpha=0.6, vmin=0.0, vmax=hi, interpolation="nearest")
        seconds = maps.video.timestamps[frames[0]]
        label = f"frame {frames[0]}" if len(frames) == 1 else f"frames {frames[0]}-{frames[-1]}"
        ax.set_title(f"{label} ({seconds:.2f} s)\n{share:.1%} of attention", fontsize=8)
    bar = fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.8, pad=0.01)
    bar.set_label("answer attention per cell (mean over answer tokens)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    where = "mean over layers" if maps.layer is None else f"layer {maps.layer}"
    fig.suptitle(f"Attention to each frame while answering ({where}, mean over heads)\n"
                 f"prompt: {_clip(maps.prompt, 70)}   answer: {_clip(maps.answer, 50)!r}", fontsize=9)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
