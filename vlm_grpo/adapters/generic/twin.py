"""A tiny twin of any image-text-to-text model type: its default config shrunk (shrink.py), its real processor
class over a locally built tokenizer that holds every special token the processor and the config name, and a
ChatML template whose image part is the placeholder the processor expands.

Nothing here names a model type. What differs between types is read off the classes themselves: the processor's
sub-processors from its `__init__`, the tokens it asks the tokenizer for (an AttributeError naming one is
answered by adding it), the token ids the config declares (`*_token_id`, `*_token_index`), and the processor
arguments the config also holds (`patch_size`, `vision_feature_select_strategy`, ...).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from vlm_grpo.adapters.chat_templates import chatml_template
from vlm_grpo.adapters.generic.shrink import PATCHES_PER_SIDE, config_nodes, is_config
from vlm_grpo.adapters.tiny_tokenizer import build_tokenizer

BASE_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"
FRAMEWORK_IDS = {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id"}
MISSING_ATTRIBUTE = re.compile(r"(?:no attribute|missing required attribute) '?(\w+)'?")
UNSET_IMAGE_ID_KEYS = {"image_token_id", "image_token_index"}  # left None by a config class: bound like the others
PIXEL_COUNT = 4096  # a `size` entry above this counts pixels (min/max pixels), not an edge


class TwinError(RuntimeError):
    """The type's twin cannot be built offline (the message says which part and why)."""


def auto_names(model_type: str) -> dict[str, Any]:
    """The auto-mapping class names of `model_type`: processor, image/video processor, feature extractor."""
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    def pick(names):
        if isinstance(names, dict):
            return names.get("torchvision") or names.get("pil")
        return names[0] if isinstance(names, (tuple, list)) else names

    return {
        "processor": PROCESSOR_MAPPING_NAMES.get(model_type),
        "image_processor": pick(IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)),
        "video_processor": pick(VIDEO_PROCESSOR_MAPPING_NAMES.get(model_type)),
        "feature_extractor": pick(FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type)),
    }


def _transformers_class(name: str | None, what: str, model_type: str):
    import transformers

    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        raise TwinError(f"{model_type}: transformers names no {what} class for it")
    return cls


# ---------------------------------------------------------------------------- image sizes
def image_side(config) -> int:
    """The side of a twin's images: PATCHES_PER_SIDE patches of the vision side's patch size."""
    vision = getattr(config, "vision_config", None)
    patch = getattr(vision, "patch_size", None) if vision is not None else None
    if isinstance(patch, (list, tuple)):
        patch = patch[0]
    return int(patch or 14) * PATCHES_PER_SIDE


def set_vision_image_size(config, side: int) -> None:
    """Every vision sub-config's image size at the twin's side (DeepSeek-VL hybrid's high-res SAM tower too: at its
    real 1024 px a twin's cache probe took 80 s)."""
    for name, vision in list(vars(config).items()):
        if not (name.endswith("vision_config") and vision is not None and hasattr(vision, "to_dict")):
            continue
        value = getattr(vision, "image_size", None)
        if isinstance(value, int) and not isinstance(value, bool):
            vision.image_size = side
        elif isinstance(value, (list, tuple)) and len(value) == 2:
            vision.image_size = type(value)([side, side])
        _fit_position_count(vision, value, side)
        if name == "vision_config":
            _scale_tile_layouts(config, value[0] if isinstance(value, (list, tuple)) else value, side)


def _scale_tile_layouts(config, old_size, side: int) -> None:
    """The tile layouts an image is fitted to (LLaVA-NeXT's `image_grid_pinpoints`, in pixels, multiples of the real
    tile size) as the same layouts of the twin's tiles: left at 336..1008 px with 112 px tiles, a 56 px image was cut
    into 19 tiles, 713 tokens."""
    grid = getattr(config, "image_grid_pinpoints", None)
    if not (isinstance(old_size, int) and old_size > 0 and isinstance(grid, list) and grid
            and all(isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(v, int) for v in p) for p in grid)):
        return
    config.image_grid_pinpoints = [[max(1, round(h / old_size)) * side, max(1, round(w / old_size)) * side]
                                   for h, w in grid]


def _fit_position_count(vision, old_size, side: int) -> None:
    """A learned position table sized for the real image's patch grid (Molmo 2's `num_position_embeddings`, one per
    patch, maybe plus a class token) follows the twin's grid."""
    count, patch = getattr(vision, "num_position_embeddings", None), getattr(vision, "patch_size", None)
    old = old_size[0] if isinstance(old_size, (list, tuple)) else old_size
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (count, patch, old)):
        return
    extra = count - (old // patch) ** 2
    if extra in (0, 1):
        vision.num_position_embeddings = (side // patch) ** 2 + extra


def _entries(value: Any) -> dict | None:
    """A size setting (dict or transformers' SizeDict) as a dict of its set entries."""
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if v is not None}
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if getattr(value, f.name) is not None}
    return None


def sized_kwargs(part, side: int, patch: int) -> dict[str, Any]:
    """An image or video processor's size settings at the twin's scale: every edge becomes `side`; pixel counts
    (min/max pixels) span a 4x4-patch image to a side x side one."""
    small, large = (4 * patch) ** 2, side * side
    out: dict[str, Any] = {}
    for key in ("size", "crop_size", "max_image_size", "tile_size", "pad_size", "high_res_size"):
        entries = _entries(getattr(part, key, None))
        if not entries:
            continue
        sized = {}
        for name, value in entries.items():
            if not isinstance(value, int) or isinstance(value, bool) or name == "max_patches":
                sized[name] = value
            elif value > PIXEL_COUNT or name in ("min_pixels", "max_pixels"):
                sized[name] = large if name in ("longest_edge", "max_pixels") else small
            else:
                sized[name] = side
        out[key] = sized
    for key, value in (("min_pixels", small), ("max_pixels", large)):
        if isinstance(getattr(part, key, None), int):
            out[key] = value
    if _crops_by_patch_size(part):
        out["patch_size"] = side  # a crop (local view) the size of a twin's image
    margins = getattr(part, "overlap_margins", None)  # patches each crop shares with its neighbours (Molmo 2)
    if isinstance(margins, (list, tuple)) and sum(margins) >= side // patch // 2:
        out["overlap_margins"] = [1] * len(margins)  # the real ones would leave a twin's crop no window to slide
    return out


# ---------------------------------------------------------------------------- tokens
def config_token_names(config) -> dict[str, list[tuple[Any, str]]]:
    """token name (e.g. `image_token`, `boi_token`) -> the (config node, field) pairs holding its id."""
    names: dict[str, list[tuple[Any, str]]] = {}
    nodes = config_nodes(config)
    for node in nodes:
        for key, value in vars(node).items():
            unset_image_id = value is None and key in UNSET_IMAGE_ID_KEYS  # the checkpoints set it (MiniCPM-V 4.6)
            if key.startswith("_") or key in FRAMEWORK_IDS or isinstance(value, bool) or not (
                    isinstance(value, int) or unset_image_id):
                continue
            match = re.fullmatch(r"(\w+_token)_(?:id|index)", key) or re.fullmatch(r"(\w+)_token_id", key)
            if match:
                names.setdefault(match.group(1), []).append((node, key))
    return names


def _token_text(name: str) -> str:
    return f"<|{name}|>"


class TwinTokens:
    """The special tokens a twin's tokenizer must hold, grown as the processor asks for more."""

    def __init__(self, names: list[str]):
        self.extras: dict[str, str] = {n: _token_text(n) for n in names}  # tokenizer attribute -> token text
        self.plain: list[str] = []  # further single tokens (processor layout tokens)

    def tokenizer(self, chat_template: str):
        specials = list(dict.fromkeys(BASE_TOKENS + list(self.extras.values()) + self.plain))
        return build_tokenizer(specials, chat_template=chat_template, eos_token=EOS, pad_token=PAD,
                               extra_special_tokens=dict(self.extras))


def _processor_parts(cls, names: dict[str, Any], tokenizer, config, side: int, patch: int, model_type: str) -> dict:
    kwargs: dict[str, Any] = {}
    for attr in cls.get_attributes():
        if attr == "tokenizer":
            kwargs[attr] = tokenizer
        elif attr in ("image_processor", "video_processor", "feature_extractor"):
            part_cls = _transformers_class(names[attr], attr.replace("_", " "), model_type)
            part = part_cls()
            if attr != "feature_extractor":
                part = part_cls(**sized_kwargs(part, side, patch), **_matched_config(part, config))
            kwargs[attr] = part
        else:
            raise TwinError(f"{model_type}: its processor needs a {attr.replace('_', ' ')}, which cannot be built offline")
    return kwargs


def _config_value(config, key: str):
    nodes = config_nodes(config)
    aliases = {"merge_size": "spatial_merge_size"}
    for node in nodes:
        for name in (key, aliases.get(key)):
            if name and name in vars(node) and not is_config(getattr(node, name)):
                return getattr(node, name)
    return None


def _matched_config(part, config) -> dict[str, Any]:
    """Sub-processor settings that the model config also holds, at the config's value (patch and merge sizes, tile
    layouts)."""
    # a part that names the ViT's patch `vision_patch_size` uses `patch_size` for its crops (Step 3.7): that one
    # is left to sized_kwargs
    keys = ("vision_patch_size" if key == "patch_size" and _crops_by_patch_size(part) else key
            for key in ("patch_size", "merge_size", "temporal_patch_size", "image_grid_pinpoints"))
    return {key: _config_value(config, key.removeprefix("vision_")) for key in keys
            if getattr(part, key, None) is not None and _config_value(config, key.removeprefix("vision_")) is not None}


def _crops_by_patch_size(part) -> bool:
    return isinstance(getattr(part, "vision_patch_size", None), int) and isinstance(getattr(part, "patch_size", None), int)


def _processor_kwargs(cls, config, side: int) -> dict[str, Any]:
    """`__init__` arguments of the processor that the model config also holds (patch size, feature strategy...),
    and its own image size at the twin's."""
    skip = {"self", "chat_template", "kwargs", "args", *cls.get_attributes()}
    kwargs = {}
    for name in inspect.signature(cls.__init__).parameters:
        if name in skip or name.endswith("_token"):
            continue
        value = _config_value(config, name)
        if value is not None:
            kwargs[name] = value
        elif name in ("img_size", "image_size"):
            kwargs[name] = side
    return kwargs


def build_processor(model_type: str, config, tokens: TwinTokens, image_part_of, side: int):
    """The type's real processor over a tokenizer holding every token it asks for; `image_part_of(processor)`
    gives the chat template's image part."""
    names = auto_names(model_type)
    cls = _transformers_class(names["processor"], "processor", model_type)
    patch = side // PATCHES_PER_SIDE
    kwargs = _processor_kwargs(cls, config, side)
    for _ in range(12):
        tokenizer = tokens.tokenizer(chatml_template("<image>"))
        asked = _record_token_lookups(tokenizer)
        try:
            processor = cls(**_processor_parts(cls, names, tokenizer, config, side, patch, model_type), **kwargs)
        except (AttributeError, ValueError, KeyError) as err:
            match = MISSING_ATTRIBUTE.search(str(err))
            if not match:
                raise TwinError(f"{model_type}: its processor cannot be built offline ({type(err).__name__}: {err})") from err
            name = re.sub(r"_ids?$", "", match.group(1))
            if name in tokens.extras:
                raise TwinError(f"{model_type}: its processor asks the tokenizer for {name!r} again") from err
            tokens.extras[name] = _token_text(name)
            continue
        del tokenizer.convert_tokens_to_ids  # the class's own again
        vocab = tokenizer.get_vocab()
        missing = [t for t in _processor_token_texts(processor) if len(tokenizer.encode(t, add_special_tokens=False)) != 1]
        missing += [t for t in dict.fromkeys(asked) if t not in vocab and t not in missing]
        if missing:
            tokens.plain += missing
            continue
        template = chatml_template(image_part_of(processor))
        tokenizer.chat_template = template
        processor.chat_template = template
        tokenizer.padding_side = "left"
        return processor
    raise TwinError(f"{model_type}: its processor kept asking for more tokens")


def _record_token_lookups(tokenizer) -> list[str]:
    """Token texts the processor looks up by name while it is built (Molmo 2's `<im_patch>`, written literally and
    never a tokenizer attribute), recorded on this tokenizer instance so that the next one holds them."""
    asked: list[str] = []
    lookup = tokenizer.convert_tokens_to_ids

    def recording(texts):
        asked.extend([texts] if isinstance(texts, str) else [t for t in texts if isinstance(t, str)])
        return lookup(texts)

    tokenizer.convert_tokens_to_ids = recording
    return asked


def _processor_token_texts(processor) -> list[str]:
    return [v for k, v in vars(processor).items() if k.endswith("_token") and isinstance(v, str) and v]


def bind_token_ids(config, processor, names: dict[str, list[tuple[Any, str]]]) -> None:
    """Every token id the config declares points at that token of the twin's tokenizer; vocabularies fit it."""
    tokenizer = processor.tokenizer
    for name, fields in names.items():
        own_id = getattr(processor, f"{name}_id", None)  # the id the processor itself writes for this token
        if isinstance(own_id, int) and not isinstance(own_id, bool):
            for node, key in fields:
                setattr(node, key, own_id)
            continue
        text = getattr(processor, name, None)
        if not isinstance(text, str):
            text = getattr(tokenizer, name, None) if isinstance(getattr(tokenizer, name, None), str) else _token_text(name)
        token_id = tokenizer.convert_tokens_to_ids(text)
        for node, key in fields:
            setattr(node, key, token_id)
    ids = {"bos_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    vocab = len(tokenizer)
    for node in config_nodes(config):
        for key, value in ids.items():
            if key in vars(node):
                setattr(node, key, value)
        for key in [k for k, v in vars(node).items() if k.startswith("vocab_size") and isinstance(v, int)]:
            setattr(node, key, vocab)  # and per-layer input tables (Gemma 3n's vocab_size_per_layer_input)
