"""One teacher-forced forward over prompt + completion: the logits the training loss and the cache probe read."""

from __future__ import annotations

import torch


def completion_logits(adapter, batch, completion_ids: torch.Tensor, completion_mask: torch.Tensor, model=None, inputs=None):
    """Logits that predict each completion token: [B, T, V], from a single prompt+completion forward.

    `inputs`: ready model kwargs (e.g. `sharing.embed_with_features`); default `adapter.completion_inputs`.
    """
    model = adapter.model if model is None else model
    if inputs is None:
        inputs = adapter.completion_inputs(batch, completion_ids, completion_mask)
    steps = completion_ids.shape[1]
    # logits_to_keep=T+1 keeps the last prompt position (predicts token 0) through the second-to-last token.
    out = model(**inputs, logits_to_keep=steps + 1, use_cache=False)
    return out.logits[:, -(steps + 1):-1, :]  # a model that ignores logits_to_keep (MiniCPM-V 4.6) returns them all
