"""Simulated generation faults, to prove the cache probe catches each kind a transformers release could bring.

Each fault wraps the model's forward and, family-independently, corrupts what cached decoding sees after
the prefill; the prefill, uncached generation and the teacher-forced forward are untouched (NaN weights
excepted, which break every path):

- `drop_image`: the image positions of the KV cache are zeroed (image information lost, the VSR study's quirk);
- `drop_video`: the video positions of the KV cache are zeroed (the video placeholder's; frames laid out as
  images use the image placeholder);
- `late_drop`: the same, but only from decode step `LATE_STEP` on (a probe of few steps misses it);
- `shift_positions`: cached decode steps get their position ids shifted by one;
- `reorder_image_cache`: the cached values of the image positions are rolled by one position (each image key
  meets its neighbour's value);
- `mask_image_attention`: cached decode steps cannot attend to the image positions;
- `nan_weights`: the output head's weights are NaN.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from vlm_grpo.compat.names import FAULTS, IMAGE_FAULTS, VIDEO_FAULTS  # noqa: F401 - names offered here too
LATE_STEP = 6


def _cache_layers(cache):
    for layer in getattr(cache, "layers", []):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            yield layer


@contextlib.contextmanager
def simulated_fault(adapter, kind: str = "drop_image"):
    if kind not in FAULTS:
        raise ValueError(f"unknown simulated fault {kind!r}; choose one of {', '.join(FAULTS)}")
    model = adapter.model
    if kind == "nan_weights":
        with _nan_head(model):
            yield
        return
    original = model.forward
    state: dict = {"step": 0}

    @functools.wraps(original)  # generate() validates kwargs against forward's signature
    def forward(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        layers = list(_cache_layers(cache)) if cache is not None else []
        input_ids = kwargs.get("input_ids")
        if not layers:
            if input_ids is not None:
                token = adapter.video_token_id if kind == "drop_video" else adapter.image_token_id
                state["mask"], state["step"] = input_ids == token, 0  # remembered at prefill
        elif "mask" in state:
            state["step"] += 1
            kwargs = _corrupt(kind, state, layers, kwargs)
        return original(*args, **kwargs)

    model.forward = forward
    try:
        yield
    finally:
        del model.forward  # the instance attribute goes; the class method is back


def _image_positions(state: dict, layer) -> torch.Tensor:
    """[B, cached length] True at the prompt's image positions."""
    mask = state["mask"]
    out = torch.zeros(mask.shape[0], layer.keys.shape[2], dtype=torch.bool, device=layer.keys.device)
    width = min(mask.shape[1], out.shape[1])
    out[:, :width] = mask[:, :width].to(out.device)
    return out


def _corrupt(kind: str, state: dict, layers: list, kwargs: dict) -> dict:
    if kind in ("drop_image", "drop_video") or (kind == "late_drop" and state["step"] >= LATE_STEP):
        for layer in layers:
            keep = ~_image_positions(state, layer)
            layer.keys.mul_(keep[:, None, :, None].to(layer.keys.dtype))
            layer.values.mul_(keep[:, None, :, None].to(layer.values.dtype))
    elif kind == "reorder_image_cache" and state["step"] == 1:  # once: the cache keeps it from then on
        for layer in layers:
            image = _image_positions(state, layer)
            for row in range(image.shape[0]):
                where = image[row].nonzero().flatten()
                if len(where) > 1:
                    layer.values[row, :, where] = layer.values[row, :, where.roll(1)]
    elif kind == "shift_positions" and kwargs.get("position_ids") is not None:
        kwargs = {**kwargs, "position_ids": kwargs["position_ids"] + 1}
    elif kind == "mask_image_attention":
        image = _image_positions(state, layers[0])
        mask = torch.cat([~image, image.new_ones(image.shape[0], kwargs["input_ids"].shape[1])], dim=1)
        given = kwargs.get("attention_mask")
        if given is not None and given.dim() == 2:
            mask = mask & given.bool()
        kwargs = {**kwargs, "attention_mask": mask.long()}
    return kwargs


@contextlib.contextmanager
def _nan_head(model):
    head = model.get_output_embeddings().weight
    saved = head.detach().clone()
    with torch.no_grad():
        head.fill_(float("nan"))
    try:
        yield
    finally:
        with torch.no_grad():
            head.copy_(saved)
