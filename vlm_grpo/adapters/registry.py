"""Model selection with one flag: `family:PATH`, `tiny:family`, `preset:name`, `pretrained:name` (shipped in
the package), or a bare path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FAMILIES: dict[str, type] = {}  # family name -> adapter class
MODEL_TYPES: dict[str, type] = {}  # config.model_type -> adapter class


def register(adapter_cls: type) -> type:
    FAMILIES[adapter_cls.family] = adapter_cls
    for model_type in adapter_cls.model_types:
        MODEL_TYPES.setdefault(model_type, adapter_cls)
    return adapter_cls


def _ensure_loaded() -> None:
    # Importing the package registers every built-in adapter.
    import vlm_grpo.adapters  # noqa: F401


def family_class(family: str) -> type:
    _ensure_loaded()
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; supported families: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[family]


def class_for_model_type(model_type: str, where: str = "") -> type:
    _ensure_loaded()
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r}{' in ' + where if where else ''}; "
            f"supported model types: {', '.join(sorted(MODEL_TYPES))}"
        )
    return MODEL_TYPES[model_type]


def all_presets() -> dict[str, type]:
    _ensure_loaded()
    return {name: cls for cls in FAMILIES.values() for name in cls.presets}


def read_model_type(path: str) -> str:
    config_file = Path(path) / "config.json"
    if config_file.is_file():
        return json.loads(config_file.read_text())["model_type"]
    from transformers import AutoConfig  # a hub id: let transformers fetch (or find in its cache)

    return AutoConfig.from_pretrained(path).model_type


def load_adapter(spec: str, **load_kwargs: Any):
    """`tiny:F` | `preset:NAME` | `pretrained:NAME` | `FAMILY:PATH_OR_HUB_ID` | `PATH` (family read from config.model_type)."""
    _ensure_loaded()
    prefix, sep, rest = spec.partition(":")
    if sep and prefix == "tiny":
        return family_class(rest).tiny(seed=int(load_kwargs.get("seed", 0)))
    if sep and prefix == "preset":
        presets = all_presets()
        if rest not in presets:
            raise ValueError(f"unknown preset {rest!r}; known presets: {', '.join(sorted(presets))}")
        return presets[rest].preset(rest, seed=int(load_kwargs.get("seed", 0)))
    load_kwargs.pop("seed", None)
    if sep and prefix == "pretrained":  # a checkpoint shipped inside the package (vlm_grpo/pretrained)
        from vlm_grpo import pretrained

        spec = str(pretrained.path(rest))
    if sep and prefix in FAMILIES and not os.path.isabs(spec):
        return FAMILIES[prefix].load(rest, **load_kwargs)
    if sep and not os.path.exists(spec):
        raise ValueError(f"unknown model family {prefix!r} in {spec!r}; supported families: {', '.join(sorted(FAMILIES))}")
    model_type = read_model_type(spec)
    return class_for_model_type(model_type, where=spec).load(spec, **load_kwargs)
