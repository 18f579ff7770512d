"""Fit a twin's processor to its shrunk model: the placeholder tokens it writes per image must equal the features
the model's own image-feature function gives that image.

Processors carry per-image token counts sized for the real vision tower (`image_seq_len`, `num_image_tokens`,
`image_seq_length`, ...), or an extra-token count (a CLS token kept or dropped). One image is encoded both ways:
the processor's count T and the model's count F. A count setting of the processor or its image processor that
holds T (or is unset) is set to F; an extra-token setting moves by F - T. The model is never changed here.
"""

from __future__ import annotations

import inspect

import torch
from PIL import Image

from vlm_grpo.adapters.generic.support import features_per_image

COUNT_NAMES = ("image_seq_len", "image_seq_length", "num_image_tokens", "image_tokens", "num_query_tokens",
               "tokens_per_image", "mm_tokens_per_image")
EXTRA_NAMES = ("num_additional_image_tokens",)
# a processor's tokens per side of a square tile (Cohere2-Vision writes patch_size**2 tokens per tile)
SIDE_NAMES = ("patch_size",)


def _image(side: int) -> Image.Image:
    img = Image.new("RGB", (side, side), (255, 255, 255))
    img.paste((200, 30, 30), (side // 4, side // 4, side // 2, side // 2))
    return img


def feature_owner(model: torch.nn.Module) -> torch.nn.Module:
    inner = getattr(model, "model", None)
    return inner if hasattr(inner, "get_image_features") else model


def model_features(model, processor, side: int) -> int | None:
    """Image features the model gives one side x side image (None when its processor output does not run)."""
    owner = feature_owner(model)
    if not hasattr(owner, "get_image_features"):
        return None
    names = [p.name for p in inspect.signature(owner.get_image_features).parameters.values()
             if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    try:
        pixels = processor.image_processor(images=[_image(side)], return_tensors="pt")
        dtype = next(model.parameters()).dtype  # some image processors hand out bfloat16 pixels
        inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in pixels.items()
                  if k in names and isinstance(v, torch.Tensor)}
        with torch.no_grad():
            out = owner.get_image_features(**inputs, return_dict=True)
    except Exception:  # the image processor's output alone does not drive the feature function
        return None
    try:
        return sum(features_per_image(out, ""))
    except ValueError:
        return None


def processor_tokens(processor, image_token_id: int, side: int) -> int | None:
    text = getattr(processor, "image_token", None) or "<image>"
    try:
        out = processor(text=[text], images=[_image(side)], return_tensors="pt")
    except Exception:
        return None
    return int((out["input_ids"] == image_token_id).sum())


def rebind_image_token(model, processor, image_token_id: int, side: int) -> int:
    """The id a processor really writes once per image feature: where it expands its placeholder into another token
    (a patch token) that many times, the config's image id follows it. Returns the id in force."""
    features = model_features(model, processor, side)
    text = getattr(processor, "image_token", None) or "<image>"
    try:
        ids = processor(text=[text], images=[_image(side)], return_tensors="pt")["input_ids"].flatten().tolist()
    except Exception:
        return image_token_id
    special = set(processor.tokenizer.added_tokens_decoder)
    counts = {i: ids.count(i) for i in set(ids) if i in special}
    if features is None or counts.get(image_token_id, 0) == features:
        return image_token_id
    matching = [i for i, n in counts.items() if n == features]
    if len(matching) != 1:
        return image_token_id
    written = matching[0]
    for node in [model.config] + [v for v in vars(model.config).values() if hasattr(v, "to_dict")]:
        aliased = set(getattr(type(node), "attribute_map", {}).get(k) for k in ("image_token_id", "image_token_index"))
        for key, value in list(vars(node).items()):
            if value == image_token_id and isinstance(value, int) and ("image_token" in key or key in aliased):
                setattr(node, key, written)
    return written


def _owners(processor) -> list:
    return [processor] + [p for p in (getattr(processor, "image_processor", None),) if p is not None]


def fit_token_counts(model, processor, image_token_id: int, side: int) -> list[str]:
    """Adjust the processor's per-image count settings until it writes the model's feature count; returns what
    it changed (empty when nothing needed to, or nothing could be fitted)."""
    features = model_features(model, processor, side)
    if features is None:
        return []
    changed: list[str] = []
    tokens = processor_tokens(processor, image_token_id, side)
    if tokens == features:
        return changed
    for owner in _owners(processor):
        for name in COUNT_NAMES:  # on the instance, or a class-level default (GotOcr2Processor.num_image_tokens)
            if name in vars(owner) or isinstance(vars(type(owner)).get(name), int):
                value = getattr(owner, name)
                if value is None or value == tokens:
                    setattr(owner, name, features)
                    changed.append(f"{type(owner).__name__}.{name} = {features}")
        for name in EXTRA_NAMES:
            value = vars(owner).get(name)
            if isinstance(value, int) and tokens is not None and 0 <= value + features - tokens <= 2:
                setattr(owner, name, value + features - tokens)
                changed.append(f"{type(owner).__name__}.{name} = {value + features - tokens}")
    changed += _refit_expanded_text(processor, tokens, features) if changed else []
    side_of = round(features ** 0.5)
    for owner, name in [(o, n) for o in _owners(processor) for n in SIDE_NAMES]:
        # on the image processor too: the processor copies it from there when loaded (Cohere2-Vision), so a saved
        # twin reloads fitted
        value = getattr(owner, name, None)
        if isinstance(value, int) and tokens and value ** 2 == tokens and side_of ** 2 == features:
            setattr(owner, name, side_of)
            changed.append(f"{type(owner).__name__}.{name} = {side_of}")
    return changed


def _refit_expanded_text(processor, tokens: int | None, features: int) -> list[str]:
    """Text a processor expanded from its count at construction (Gemma 3n's `full_image_sequence`: the image token
    written T times) written again with the fitted count."""
    text = getattr(processor, "image_token", None)
    if not isinstance(text, str) or not text or not tokens:
        return []
    changed = []
    for name, value in list(vars(processor).items()):
        if isinstance(value, str) and value.count(text) == tokens and text * tokens in value:
            setattr(processor, name, value.replace(text * tokens, text * features))
            changed.append(f"{type(processor).__name__}.{name}: {features} image tokens")
    return changed


def fit_temporal_patch(model, processor) -> list[str]:
    """An image processor that stacks `temporal_patch_size` frames per patch row (Qwen2-VL's, default 2) feeding a
    vision tower whose patch embedding is a 2-D convolution over one frame (Dots3 Note's): one frame per row, as the
    real checkpoints' preprocessor configs set it."""
    image_processor = getattr(processor, "image_processor", None)
    frames, patch = getattr(image_processor, "temporal_patch_size", None), getattr(image_processor, "patch_size", None)
    if not isinstance(frames, int) or frames == 1 or not isinstance(patch, int):
        return []
    if any(isinstance(m, torch.nn.Conv3d) for m in model.modules()):
        return []
    conv = next((m for m in model.modules() if isinstance(m, torch.nn.Conv2d)), None)
    if conv is None or conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1] != 3 * patch * patch:
        return []
    image_processor.temporal_patch_size = 1
    return [f"{type(image_processor).__name__}.temporal_patch_size = 1"]
