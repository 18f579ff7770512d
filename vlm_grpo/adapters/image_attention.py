"""How much attention answer tokens pay to the image: one teacher-forced forward over prompt + completion with eager
attention (the only implementation that returns weights), averaged over heads and layers (or one layer).

The attention that chose completion token t is the row of the query one position before it (the position whose
logits produced t). Shared by the heatmaps (inspect/attention.py) and the grounding monitor of training runs.
"""

from __future__ import annotations

import contextlib

import torch


def _attn_tree(config) -> dict:
    tree = {"": config._attn_implementation}
    for key in getattr(config, "sub_configs", {}):
        sub = getattr(config, key, None)
        if sub is not None:
            tree[key] = _attn_tree(sub)
    return tree


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module):
    """Eager attention (the one that returns weights) inside the block, the previous implementations after."""
    before = _attn_tree(model.config)
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def mean_attention(model: torch.nn.Module, inputs: dict, layer: int | None = None, family: str = "") -> torch.Tensor:
    """[rows, queries, keys] attention weights of one no-grad forward, mean over heads and over layers (or `layer`)."""
    with eager_attention(model), torch.no_grad():
        attentions = model(**inputs, output_attentions=True).attentions
    if not attentions or any(a is None for a in attentions):
        raise RuntimeError(f"{family or type(model).__name__}: the model returned no attention weights")
    if layer is not None:
        if not -len(attentions) <= layer < len(attentions):
            raise ValueError(f"layer {layer} out of range: the language model has {len(attentions)} layers")
        return attentions[layer].float().mean(1)
    return sum(a.float().mean(1) for a in attentions) / len(attentions)  # one layer at a time: no [L, ...] stack


def answer_queries(prompt_len: int, steps: int, device) -> torch.Tensor:
    """The query positions whose attention produced completion tokens 0 .. steps-1."""
    return torch.arange(prompt_len - 1, prompt_len - 1 + steps, device=device)


def image_attention_share(adapter, batch, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          model: torch.nn.Module | None = None) -> float:
    """Mean over the completions' tokens (mask) of the share of their attention on image tokens (every image of
    the row, delimiters excluded); row i of `batch` is completion i's prompt."""
    model = adapter.model if model is None else model
    inputs = adapter.completion_inputs(batch, completion_ids, completion_mask)
    att = mean_attention(model, inputs, family=adapter.family)
    queries = answer_queries(batch.input_ids.shape[1], completion_ids.shape[1], att.device)
    shares, weights = [], []
    for row in range(len(batch)):
        keys = [k for image in range(len(batch.image_spans[row])) for k in adapter.image_token_indices(batch, row, image)]
        if not keys:
            continue
        share = att[row][queries][:, torch.tensor(keys, device=att.device)].sum(-1)  # [T]
        mask = completion_mask[row].to(share.dtype)
        shares.append((share * mask).sum())
        weights.append(mask.sum())
    if not weights or float(sum(weights)) == 0:
        return float("nan")
    return float(sum(shares) / sum(weights))
