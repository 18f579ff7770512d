"""Gradient checkpointing for the language model and the vision tower (transformers' own, per decoder/vision block).

transformers only checkpoints a block while it is in training mode, and a checkpointed block drops the KV cache.
GRPO keeps the policy in eval mode (no dropout, so the importance ratio compares like with like) and generates
with the cache, so the blocks are switched to checkpointing only around the forwards that build a gradient.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from vlm_grpo.adapters.features import hf_core


def enable(model: torch.nn.Module, kwargs: dict | None = None) -> int:
    """Turn checkpointing on in every checkpointable block (`kwargs`: torch.utils.checkpoint's, over the default
    use_reentrant=False); returns how many blocks it covers."""
    core = hf_core(model)
    if not getattr(core, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(core).__name__} does not support gradient checkpointing")
    core.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False, **(kwargs or {})})
    return sum(isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing for m in core.modules())


@contextlib.contextmanager
def active(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, checkpointed blocks recompute in backward even if the model is in eval mode (only the
    blocks' own flag changes: dropout and attention inside them stay as the model's mode says)."""
    if not enabled or not torch.is_grad_enabled():
        yield
        return
    blocks = [m for m in hf_core(model).modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    before = [m.training for m in blocks]
    for m in blocks:
        m.training = True
    try:
        yield
    finally:
        for m, mode in zip(blocks, before):
            m.training = mode
