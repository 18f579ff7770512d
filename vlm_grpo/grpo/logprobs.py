"""Per-token log-probabilities of completions from one teacher-forced forward."""

from __future__ import annotations

import torch


def completion_logits(adapter, batch, completion_ids: torch.Tensor, completion_mask: torch.Tensor, model=None):
    """Logits that predict each completion token: [B, T, V], from a single prompt+completion forward."""
    model = adapter.model if model is None else model
    inputs = adapter.completion_inputs(batch, completion_ids, completion_mask)
    steps = completion_ids.shape[1]
    # logits_to_keep=T+1 keeps the last prompt position (predicts token 0) through the second-to-last token.
    out = model(**inputs, logits_to_keep=steps + 1, use_cache=False)
    return out.logits[:, :-1, :]


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log p(token) under `logits`, computed in fp32: [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def completion_logprobs(adapter, batch, completion_ids, completion_mask, model=None) -> torch.Tensor:
    logits = completion_logits(adapter, batch, completion_ids, completion_mask, model=model)
    return token_logprobs(logits, completion_ids)
