"""Build a generic tiny twin: the shrunk config (shrink.py), the real processor over a local tokenizer (twin.py),
the token ids bound to that tokenizer, and the model with random weights from the seed."""

from __future__ import annotations

import inspect
import re
import sys

import torch

from vlm_grpo.adapters.generic.shrink import HEAD_DIM, config_nodes, shrink_config
from vlm_grpo.adapters.generic.twin import (
    TwinError,
    TwinTokens,
    bind_token_ids,
    build_processor,
    config_token_names,
    image_side,
    set_vision_image_size,
)
from vlm_grpo.adapters.generic.support import check_generation, image_token_id, needed_extra
from vlm_grpo.adapters.generic.twin_fit import fit_temporal_patch, fit_token_counts, rebind_image_token
from vlm_grpo.adapters.seeding import seeded_model

# a rotary split the modeling code falls back to when the config has none: `rope_parameters.get("mrope_section", [..])`
CODE_DEFAULT_SECTION = re.compile(r"""get\(\s*["']mrope_section["']\s*,\s*\[([\d,\s]+)\]""")


def default_config(model_type: str):
    from transformers import CONFIG_MAPPING

    try:
        config = CONFIG_MAPPING[model_type]()
        # an optional vision sub-config the defaults leave out (Gemma 4 unified): built from its own defaults
        unset = [name for name in getattr(type(config), "sub_configs_defaults", None) or {}
                 if "vision" in name and getattr(config, name, 0) is None]
        return CONFIG_MAPPING[model_type](**{name: {} for name in unset}) if unset else config
    except Exception as err:  # a config class that cannot be built from its defaults
        raise TwinError(f"{model_type}: its default config cannot be built ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:160]})") from None


def _code_default_sections(model: torch.nn.Module) -> list[int] | None:
    """The rotary split the model's own modeling code falls back to, if any of its modules has one."""
    for name in sorted({type(m).__module__ for m in model.modules()}):
        try:
            match = CODE_DEFAULT_SECTION.search(inspect.getsource(sys.modules[name]))
        except (OSError, TypeError, KeyError):
            continue
        if match:
            return [int(x) for x in match.group(1).split(",") if x.strip()]
    return None


def fill_code_default_rope(config, model: torch.nn.Module) -> bool:
    """Where the modeling code assumes a rotary split the config leaves out, write that split, rescaled to the
    twin's head dim, into the config (the code's default sums to the real head's half-dim). True if it did."""
    sections = _code_default_sections(model)
    if not sections:
        return False
    filled = False
    for node in config_nodes(config):
        rope = getattr(node, "rope_parameters", None)
        if not isinstance(rope, dict) or "mrope_section" in rope or any(isinstance(v, dict) for v in rope.values()):
            continue
        if "rope_theta" not in rope or getattr(node, "num_hidden_layers", None) is None:
            continue
        head_dim = getattr(node, "head_dim", None) or HEAD_DIM
        total, target = sum(sections), head_dim // 2
        scaled = [max(1, s * target // total) for s in sections]
        scaled[-1] += target - sum(scaled)
        node.rope_parameters = {**rope, "mrope_section": scaled}
        filled = True
    return filled


def rebuilt(config):
    """`config` rebuilt from its own dict, so fields its `__init__` derives (head dims, layer kinds) follow the
    shrunk values; the shrunk object itself where a config does not round-trip."""
    try:
        return type(config).from_dict(config.to_dict())
    except Exception:
        return config


def _record_dtype(config, dtype: torch.dtype) -> None:
    for node in config_nodes(config):
        node.dtype = dtype


def build_twin(model_type: str, model_class: type, seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, processor) of `model_type`'s tiny twin; TwinError says which part cannot be built offline."""
    config = default_config(model_type)
    try:
        shrink_config(config)
    except Exception as err:
        raise TwinError(f"{model_type}: its config cannot be shrunk generically ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:160]})") from None
    side = image_side(config)
    set_vision_image_size(config, side)
    config = rebuilt(config)
    names = config_token_names(config)
    tokens = TwinTokens(list(names))
    processor = build_processor(model_type, config, tokens, lambda p: getattr(p, "image_token", None) or "<image>", side)
    bind_token_ids(config, processor, names)
    _record_dtype(config, dtype)
    try:
        model = seeded_model(model_class, config, seed, dtype)
        if fill_code_default_rope(config, model):
            model = seeded_model(model_class, config, seed, dtype)
    except ImportError as err:
        raise TwinError(f"{model_type}: the model needs a package that is not installed "
                        f"({needed_extra(str(err).strip().splitlines()[0][:120])})") from None
    except Exception as err:
        raise TwinError(f"{model_type}: the shrunk config does not build a model ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:160]})") from None
    check_generation(model_type, model)
    fit_temporal_patch(model, processor)
    token_id = rebind_image_token(model, processor, image_token_id(model.config, processor, model_type), side)
    fit_token_counts(model, processor, token_id, side)
    tokenizer = processor.tokenizer
    model.generation_config.eos_token_id = [tokenizer.eos_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.pad_token_id
    return model, processor

