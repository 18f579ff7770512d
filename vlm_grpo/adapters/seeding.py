"""Deterministic random weights: the same seed gives the same tiny twin on every machine."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Modules built in the block are created in `dtype` (a real-size model built in its own dtype never exists in
    float32 too)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def seeded_model(model_cls: type, config, seed: int, dtype: torch.dtype) -> torch.nn.Module:
    """`model_cls(config)` in `dtype` and eval mode, its random weights drawn from `seed` alone."""
    with seeded(seed):
        model = model_cls(config)
    # real tensors only: `Module.to(dtype)` would also cast complex buffers (Llama 4's vision rotary `freqs_ci`) to
    # real, dropping their imaginary part, so the twin would differ from itself saved and reloaded
    return model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t).eval()
