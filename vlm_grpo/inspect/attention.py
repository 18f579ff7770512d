"""Where does the model look? Attention from each generated token to the image, mapped onto the image.

One greedy answer, then one teacher-forced forward over prompt + answer with eager attention (the
only implementation that returns attention weights). The attention that chose answer token t is the
row of the query one position before it (the position whose logits produced t). Its mass on each
image token is spread over that token's rectangle of the image (`adapter.image_token_positions`), so
every family, tiles and thumbnails included, lands on one grid in image coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.image_attention import _attn_tree, answer_queries, eager_attention, mean_attention  # noqa: F401
from vlm_grpo.adapters.image_layout import ImageCell


@dataclass
class AttentionMaps:
    """Per generated token: a heatmap over the image and the share of its attention that the image got."""

    image: Image.Image
    prompt: str
    tokens: list[str]  # generated tokens, decoded one by one
    heatmaps: np.ndarray  # [T, rows, cols]: attention mass per cell of the image grid
    image_share: np.ndarray  # [T]: total attention on image tokens (0..1)
    layer: int | None  # None: mean over layers

    @property
    def answer(self) -> str:
        return "".join(self.tokens)

    @property
    def mean_heatmap(self) -> np.ndarray:
        return self.heatmaps.mean(axis=0)


# ---------------------------------------------------------------- cells -> grid
def heatmap_grid_shape(cells: Sequence[ImageCell]) -> tuple[int, int]:
    """Rows and columns of the finest token grid (coarser cells, e.g. a thumbnail's, are spread over it)."""
    rows = round(1.0 / min(c.y1 - c.y0 for c in cells))
    cols = round(1.0 / min(c.x1 - c.x0 for c in cells))
    return int(rows), int(cols)


def cell_weights(cells: Sequence[ImageCell], shape: tuple[int, int]) -> np.ndarray:
    """[n_tokens, rows, cols]: the fraction of each token's rectangle that falls in each grid cell (rows sum to 1)."""
    rows, cols = shape
    ys, xs = np.linspace(0.0, 1.0, rows + 1), np.linspace(0.0, 1.0, cols + 1)
    out = np.zeros((len(cells), rows, cols))
    for k, c in enumerate(cells):
        oy = np.clip(np.minimum(ys[1:], c.y1) - np.maximum(ys[:-1], c.y0), 0.0, None)
        ox = np.clip(np.minimum(xs[1:], c.x1) - np.maximum(xs[:-1], c.x0), 0.0, None)
        area = (c.y1 - c.y0) * (c.x1 - c.x0)
        out[k] = np.outer(oy, ox) / area
    return out


def attention_to_heatmap(
    attention: torch.Tensor | np.ndarray, cells: Sequence[ImageCell], shape: tuple[int, int] | None = None
) -> np.ndarray:
    """attention [..., n_tokens] over the cells' tokens (in cell order) -> heatmap [..., rows, cols].

    Mass-preserving: a token's attention is shared among the grid cells its rectangle covers, so the
    heatmap sums to the attention the image tokens received.
    """
    shape = shape or heatmap_grid_shape(cells)
    weights = cell_weights(cells, shape)  # [n, R, C]
    att = attention.detach().float().cpu().numpy() if isinstance(attention, torch.Tensor) else np.asarray(attention)
    if att.shape[-1] != len(cells):
        raise ValueError(f"attention over {att.shape[-1]} tokens, but the image has {len(cells)} token cells")
    return np.tensordot(att, weights, axes=([-1], [0]))


# ---------------------------------------------------------------- model side
def answer_rows(adapter: VLMAdapter, batch, *, max_new_tokens: int, layer: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy answer to a one-prompt batch, then ([T, K] attention of each answer token's query over the prompt +
    answer keys, mean over heads and over layers or one `layer`; the answer ids [1, T])."""
    model = adapter.model
    out = adapter.generate(batch, max_new_tokens=max_new_tokens)
    prompt_len = batch.input_ids.shape[1]
    completion = out.sequences[:, prompt_len:]
    completion = completion[:, : _answer_length(completion[0].tolist(), adapter)]
    inputs = adapter.completion_inputs(batch, completion, torch.ones_like(completion))
    att = mean_attention(model, inputs, layer=layer, family=adapter.family)[0]  # [Q, K], mean over heads (and layers)
    queries = answer_queries(prompt_len, completion.shape[1], att.device)
    return att[queries], completion


def answer_attention(
    adapter: VLMAdapter, image: Image.Image, prompt: str, *, max_new_tokens: int = 24, layer: int | None = None,
) -> AttentionMaps:
    """Greedy answer to (image, prompt), then its attention to the image, one heatmap per answer token."""
    if adapter.cross_attention:
        raise ValueError(f"{adapter.family} reads images through cross-attention layers, not image tokens: there is no "
                         "attention to image tokens to map")
    model = adapter.model
    device = next(model.parameters()).device
    dtype = model.dtype if model.dtype.is_floating_point else None
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    image = image.convert("RGB")
    batch = adapter.encode_prompts([conversation], [[image]]).to(device, dtype)
    rows, completion = answer_rows(adapter, batch, max_new_tokens=max_new_tokens, layer=layer)
    cells = adapter.image_token_positions(batch, 0, 0, image_size=(image.height, image.width))
    keys = torch.tensor([c.token_index for c in cells], device=rows.device)
    heatmaps = attention_to_heatmap(rows[:, keys], cells)  # [T, n_image_tokens] -> grid
    # Every image token's share, delimiters and CLS excluded: the image-token positions of the whole span.
    all_image = torch.tensor(adapter.image_token_indices(batch, 0, 0), device=rows.device)
    share = rows[:, all_image].sum(-1).cpu().numpy()
    tokens = [adapter.tokenizer.decode([t]) for t in completion[0].tolist()]
    return AttentionMaps(image=image, prompt=prompt, tokens=tokens, heatmaps=heatmaps, image_share=share, layer=layer)


def _answer_length(ids: list[int], adapter: VLMAdapter) -> int:
    """Tokens up to and including the first end-of-sequence (padding after it dropped); at least one."""
    stops = set(adapter.eos_token_ids)
    for k, tok in enumerate(ids):
        if tok in stops:
            return k + 1
    return max(len(ids), 1)


# ---------------------------------------------------------------- rendering
def render_attention(maps: AttentionMaps, out: str | Path, *, max_panels: int = 24, panel_size: float = 2.2,
                     dpi: int = 90) -> Path:
    """A grid PNG: the answer-averaged map first, then one panel per generated token, each over the image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("answer mean", maps.mean_heatmap, float(maps.image_share.mean()))]
    for tok, hm, share in list(zip(maps.tokens, maps.heatmaps, maps.image_share))[: max_panels - 1]:
        panels.append((repr(tok)[1:-1] or "∅", hm, float(share)))
    # Each panel: where the token's image attention goes (its share per cell; how much of its attention
    # the image got at all is in the title). One colour scale for all, so a sharper focus stands out.
    panels = [(title, hm / hm.sum() if hm.sum() > 0 else hm, share) for title, hm, share in panels]
    lo = min(float(hm.min()) for _, hm, _ in panels)
    hi = max(float(hm.max()) for _, hm, _ in panels)
    hi = hi if hi > lo else lo + 1e-9
    ncols = min(6, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(panel_size * ncols + 0.8, panel_size * nrows + 0.9), squeeze=False,
        layout="constrained",
    )
    w, h = maps.image.size
    for ax in axes.flat:
        ax.axis("off")
    shown = None
    for ax, (title, hm, share) in zip(axes.flat, panels):
        ax.imshow(maps.image, extent=(0, w, h, 0))
        shown = ax.imshow(hm, extent=(0, w, h, 0), cmap="inferno", alpha=0.6, vmin=lo, vmax=hi,
                          interpolation="nearest")
        ax.set_title(f"{_clip(title, 14)}\non image {share:.0%}", fontsize=8)
    bar = fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.8, pad=0.01)
    bar.set_label("share of the image attention per cell", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    where = "mean over layers" if maps.layer is None else f"layer {maps.layer}"
    fig.suptitle(
        f"Attention to the image per answer token ({where}, mean over heads)\n"
        f"prompt: {_clip(maps.prompt, 70)}   answer: {_clip(maps.answer, 50)!r}",
        fontsize=9,
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split()) if text.strip() else text
    return text if len(text) <= n else text[: n - 1] + "…"
