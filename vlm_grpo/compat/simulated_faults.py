"""Simulated generation faults, to prove the cache probe catches each kind a transformers release could bring.

Each fault wraps the model's public forward and finds the KV cache among its arguments by type (a
`transformers.Cache`), never by the argument's name, which transformers 5.24 renamed. From the first cached
decode step on it corrupts what cached decoding sees; the prefill, uncached generation and the teacher-forced
forward are untouched (NaN weights excepted, which break every path):

- `drop_image`: the image positions of the KV cache are zeroed (image information lost, the VSR study's quirk);
- `drop_video`: the video positions of the KV cache are zeroed (the video placeholder's; frames laid out as
  images use the image placeholder);
- `late_drop`: the same, but only from decode step `LATE_STEP` on (a probe of few steps misses it);
- `shift_positions`: cached decode steps get their position ids shifted by one;
- `reorder_image_cache`: the cached values of the image positions are rolled by one position (each image key
  meets its neighbour's value);
- `mask_image_attention`: cached decode steps cannot attend to the image positions;
- `nan_weights`: the output head's weights are NaN.

A fault that changes nothing would let every probe "pass", so entering a fault proves it works first: on the
probe's fixed image (or clip) it generates with and without the cache, and the cached logits must differ from the
uncached ones by more than `change_tolerance` (or turn non-finite), with the hook reached. Otherwise `InertFault`
names the fault, the family and the transformers version.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import transformers

from vlm_grpo.compat.cache_probe import PROBE_PROMPT, precision_floor, probe_inputs
from vlm_grpo.compat.names import FAULTS, IMAGE_FAULTS, VIDEO_FAULTS  # noqa: F401 - names offered here too
LATE_STEP = 6
CHECK_STEPS = LATE_STEP + 2  # the self-check decodes past the late fault's first step
CHANGE_MULTIPLE = 10  # a fault must move cached logits by 10x the precision floor (1e-4 in float32)


class InertFault(RuntimeError):
    """A simulated fault that did not change the cached path: a probe under it would prove nothing."""


def change_tolerance(model: torch.nn.Module) -> float:
    return CHANGE_MULTIPLE * precision_floor(model)


def find_cache(args: tuple, kwargs: dict):
    """The KV cache a forward was handed, found by type whatever the argument is called (None when none)."""
    for value in (*kwargs.values(), *args):
        if isinstance(value, transformers.Cache):
            return value
    return None


def _cache_layers(cache, image_layers: set[int]):
    """(layer, holds image states only) for each filled layer of `cache`: a cross-attention model's `image_layers`
    cache image states in every position."""
    for index, layer in enumerate(getattr(cache, "layers", [])):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            yield layer, index in image_layers


@contextlib.contextmanager
def simulated_fault(adapter, kind: str = "drop_image"):
    if kind not in FAULTS:
        raise ValueError(f"unknown simulated fault {kind!r}; choose one of {', '.join(FAULTS)}")
    model = adapter.model
    if kind == "nan_weights":
        with _nan_head(model):
            check_fault_changes(adapter, kind, state=None)
            yield
        return
    original = model.forward
    state: dict = {"step": 0, "fired": 0}
    image_layers = set(adapter.image_cache_layers())

    @functools.wraps(original)  # generate() validates kwargs against forward's signature
    def forward(*args, **kwargs):
        cache = find_cache(args, kwargs)
        layers = list(_cache_layers(cache, image_layers)) if cache is not None else []
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
        check_fault_changes(adapter, kind, state)
        yield
    finally:
        del model.forward  # the instance attribute goes; the class method is back


def check_fault_changes(adapter, kind: str, state: dict | None) -> float:
    """The largest |cached - uncached| logit difference the fault causes on the probe's fixed input; InertFault
    when it is within `change_tolerance`, or the hook was never reached."""
    media = "video" if kind in VIDEO_FAULTS else "image"
    item, _, encode = probe_inputs(adapter, media)
    batch = encode([PROBE_PROMPT], [item]).to(next(adapter.model.parameters()).device)
    fired = state["fired"] if state is not None else 0
    views = []
    for use_cache in (True, False):
        out = adapter.generate(batch, max_new_tokens=CHECK_STEPS, min_new_tokens=CHECK_STEPS, use_cache=use_cache,
                               output_logits=True)
        views.append((out.sequences[:, batch.input_ids.shape[1]:], torch.stack(out.logits, dim=1).float()))
    (cached_ids, cached), (uncached_ids, uncached) = views
    tolerance = change_tolerance(adapter.model)
    if not bool(torch.isfinite(cached).all()):
        return float("inf")
    # Compare up to the first step whose tokens differ: from there the two decode different texts.
    same = (cached_ids == uncached_ids).all(dim=0)
    upto = int(same.long().cumprod(0).sum()) + 1
    diff = (cached[:, :upto] - uncached[:, :upto]).abs().max().item()
    reached = state is None or state["fired"] > fired
    if diff > tolerance and reached:
        return diff
    why = "its hook was never reached" if not reached else \
        f"cached and uncached logits agree to {diff:.2e} (tolerance {tolerance:g})"
    raise InertFault(f"simulated fault {kind!r} changed nothing on {adapter.family} "
                     f"(transformers {transformers.__version__}): {why}; a probe under it would prove nothing")


def _image_positions(state: dict, layer, image_states: bool = False) -> torch.Tensor:
    """[B, cached length] True at the prompt's image positions (all of a layer of `image_states`)."""
    mask = state["mask"]
    out = torch.zeros(mask.shape[0], layer.keys.shape[2], dtype=torch.bool, device=layer.keys.device)
    if image_states:
        return ~out
    width = min(mask.shape[1], out.shape[1])
    out[:, :width] = mask[:, :width].to(out.device)
    return out


def _corrupt(kind: str, state: dict, layers: list, kwargs: dict) -> dict:
    """kwargs for this cached decode step, the cache corrupted in place; counts each injection in state["fired"]."""
    if kind in ("drop_image", "drop_video") or (kind == "late_drop" and state["step"] >= LATE_STEP):
        for layer, image_states in layers:
            keep = ~_image_positions(state, layer, image_states)
            layer.keys.mul_(keep[:, None, :, None].to(layer.keys.dtype))
            layer.values.mul_(keep[:, None, :, None].to(layer.values.dtype))
        state["fired"] += 1
    elif kind == "reorder_image_cache" and state["step"] == 1:  # once: the cache keeps it from then on
        for layer, image_states in layers:
            image = _image_positions(state, layer, image_states)
            for row in range(image.shape[0]):
                where = image[row].nonzero().flatten()
                if len(where) > 1:
                    layer.values[row, :, where] = layer.values[row, :, where.roll(1)]
        state["fired"] += 1
    elif kind == "shift_positions" and kwargs.get("position_ids") is not None:
        kwargs = {**kwargs, "position_ids": kwargs["position_ids"] + 1}
        state["fired"] += 1
    elif kind == "mask_image_attention":
        image = _image_positions(state, next(layer for layer, image_states in layers if not image_states))
        mask = torch.cat([~image, image.new_ones(image.shape[0], kwargs["input_ids"].shape[1])], dim=1)
        given = kwargs.get("attention_mask")
        if given is not None and given.dim() == 2:
            mask = mask & given.bool()
        kwargs = {**kwargs, "attention_mask": mask.long()}
        state["fired"] += 1
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
