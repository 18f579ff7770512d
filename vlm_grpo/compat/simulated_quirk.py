"""A simulated cache quirk, to prove the probe and the `auto` policy catch a real one.

It reproduces the failure the VSR study describes (image information lost in cached decoding) in a
family-independent way: after the prefill, every cached decode step sees the image positions
of the KV cache zeroed. The prefill and uncached generation are untouched.
"""

from __future__ import annotations

import contextlib
import functools

import torch


def _cache_layers(cache):
    for layer in getattr(cache, "layers", []):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            yield layer


@contextlib.contextmanager
def image_features_dropped_after_prefill(adapter):
    model = adapter.model
    original = model.forward
    image_positions: dict[str, torch.Tensor] = {}

    @functools.wraps(original)  # generate() validates kwargs against forward's signature
    def forward(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        layers = list(_cache_layers(cache)) if cache is not None else []
        input_ids = kwargs.get("input_ids")
        if not layers and input_ids is not None:
            image_positions["mask"] = input_ids == adapter.image_token_id  # remembered at prefill
        elif layers and "mask" in image_positions:
            mask = image_positions["mask"]
            for layer in layers:
                keep = torch.ones(mask.shape[0], layer.keys.shape[2], dtype=torch.bool, device=layer.keys.device)
                keep[:, : mask.shape[1]] = ~mask[:, : layer.keys.shape[2]].to(keep.device)
                layer.keys.mul_(keep[:, None, :, None].to(layer.keys.dtype))
                layer.values.mul_(keep[:, None, :, None].to(layer.values.dtype))
        return original(*args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        del model.forward  # the instance attribute goes; the class method is back
