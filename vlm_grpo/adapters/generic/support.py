"""What the generic adapter needs to know about a model type before and after loading, read off transformers.

Refusals are one line naming the model type and what is missing: not an image-text-to-text type, encoder-decoder,
no generation, no image token, no image-feature function.
"""

from __future__ import annotations

import re

from vlm_grpo.adapters.generic.shrink import config_nodes
from vlm_grpo.adapters.generic.upstream_breaks import upstream_break

FRAMEWORK_IDS = {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id"}
LAYOUT_TOKEN_NAME = re.compile(r"image|img|vision|video|patch|tile|boi|eoi|frame|media|row|col")


# optional packages some model types need -> the vlm-grpo extra that installs each (pyproject.toml)
EXTRAS = {"timm": "timm", "scipy": "scipy"}


def needed_extra(message: str) -> str:
    """`needs <package>: pip install 'vlm-grpo[<extra>]'` for the optional package an ImportError's message names
    (transformers' "requires the timm library", Python's "No module named 'scipy'"); else the message."""
    for package, extra in EXTRAS.items():
        if re.search(rf"\b{package}\b", message):
            return f"needs {package}: pip install 'vlm-grpo[{extra}]'"
    return message


def model_extra(model) -> str:
    """The extra (EXTRAS) whose package builds part of `model` (a timm tower), or ''."""
    packages = {type(m).__module__.split(".")[0] for m in model.modules()}
    return next((EXTRAS[p] for p in sorted(packages) if p in EXTRAS), "")


def missing_extra(extra: str) -> str | None:
    """`needs <package>: pip install ...` when the extra's package is not installed, else None."""
    from importlib.util import find_spec

    package = next((p for p, e in EXTRAS.items() if e == extra), None)
    return None if package is None or find_spec(package) is not None else needed_extra(package)


class GenericUnsupported(ValueError):
    """The generic adapter cannot serve this model type (the message names the type and the reason)."""


def image_text_types() -> dict[str, str]:
    """transformers' image-text-to-text mapping: model type -> model class name."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return dict(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def model_class_of(model_type: str) -> type:
    import transformers

    names = image_text_types()
    if model_type not in names:
        raise GenericUnsupported(f"{model_type}: not an image-text-to-text model type of transformers "
                                 f"{transformers.__version__}")
    broken = upstream_break(model_type, transformers.__version__)
    if broken is not None:
        raise GenericUnsupported(f"{model_type}: not on transformers {transformers.__version__}: {broken.reason}")
    cls = getattr(transformers, names[model_type], None)
    if cls is None:
        raise GenericUnsupported(f"{model_type}: transformers {transformers.__version__} does not export "
                                 f"{names[model_type]}")
    return cls


def check_generation(model_type: str, model) -> None:
    """Refuse what the GRPO loop cannot drive: an encoder-decoder, or a model that cannot generate."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        # measured on florence2's twin (docs/encoder-decoder.md): generate() returns decoder tokens only (not prompt +
        # completion), and a decoder forward over start + completion reproduces its log-probs (5e-7)
        raise GenericUnsupported(f"{model_type}: encoder-decoder model ({type(model).__name__}); its completions are "
                                 "decoder tokens apart from the prompt, and the loop scores a completion as the "
                                 "prompt's continuation (docs/encoder-decoder.md)")
    can = getattr(model, "can_generate", None)
    if not callable(can) or not can():
        raise GenericUnsupported(f"{model_type}: {type(model).__name__} has no generation (no GenerationMixin); "
                                 "GRPO samples completions from the policy")
    owner = getattr(model, "model", model)
    if not hasattr(owner, "get_image_features") and not hasattr(model, "get_image_features"):
        raise GenericUnsupported(f"{model_type}: {type(model).__name__} has no get_image_features; the adapter "
                                 "counts and shares image features through it")


def image_token_id(config, processor, model_type: str) -> int:
    """The placeholder id image features replace: the config's, else the processor's."""
    for node in config_nodes(config):
        for key in ("image_token_id", "image_token_index"):
            # the field itself, or the one a config class maps it to (Molmo 2: image_token_id -> image_patch_id)
            value = vars(node).get(getattr(type(node), "attribute_map", {}).get(key, key))
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    value = getattr(processor, "image_token_id", None)
    if isinstance(value, int):
        return value
    text = getattr(processor, "image_token", None)
    if isinstance(text, str):
        return processor.tokenizer.convert_tokens_to_ids(text)
    raise GenericUnsupported(f"{model_type}: neither the config nor the processor names an image token")


def layout_token_ids(config, processor, keep: set[int]) -> list[int]:
    """Image placeholder, delimiter and layout ids (config `*_token_id` / `*_token_index` fields, the processor's
    image tokens) that a completion must never hold; `keep` (end-of-sequence ids) is never suppressed."""
    ids: set[int] = set()
    for node in config_nodes(config):
        for key, value in vars(node).items():
            if key in FRAMEWORK_IDS or not isinstance(value, int) or isinstance(value, bool):
                continue
            if re.fullmatch(r"\w+_token_(?:id|index)|\w+_id", key) and "token" in key and LAYOUT_TOKEN_NAME.search(key):
                ids.add(value)
    tokenizer = processor.tokenizer
    for key, text in vars(processor).items():
        if key.endswith("_token") and isinstance(text, str) and text and LAYOUT_TOKEN_NAME.search(key):
            token_id = tokenizer.convert_tokens_to_ids(text)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                ids.add(token_id)
    vocab = len(tokenizer)
    return sorted(i for i in ids if 0 <= i < max(vocab, config.get_text_config().vocab_size or 0) and i not in keep)


def features_per_image(out, model_type: str) -> list[int]:
    """Image features per image in what `get_image_features` returned: its pooled (projected) features, else its
    last hidden state (features before the projector: the same count)."""
    import torch

    pooled = getattr(out, "pooler_output", None)
    if pooled is None:
        pooled = out if isinstance(out, (torch.Tensor, list, tuple)) else getattr(out, "last_hidden_state", None)
    if isinstance(pooled, (list, tuple)):
        return [int(p.reshape(-1, p.shape[-1]).shape[0]) for p in pooled]
    if not isinstance(pooled, torch.Tensor):
        raise GenericUnsupported(f"{model_type}: get_image_features returns no features to count")
    if pooled.dim() == 3:
        return [int(pooled.shape[1])] * int(pooled.shape[0])
    return [int(pooled.reshape(-1, pooled.shape[-1]).shape[0])]
