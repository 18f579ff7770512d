"""Which adapter serves a family name or a `config.model_type`.

Families are discovered, not listed: every module of `vlm_grpo.adapters.families` is imported once and
each `VLMAdapter` subclass it defines with its own `family` is registered. Adding a family is adding a file (and
its twin in `adapters/twins/`, which the adapter imports: the registry reads family files only).
A model type of transformers' image-text-to-text mapping that no family file claims is served by the generic
adapter (adapters/generic/).
"""

from __future__ import annotations

import importlib
import pkgutil

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.generic.adapter import generic_adapter_class
from vlm_grpo.adapters.generic.support import image_text_types

FAMILIES: dict[str, type[VLMAdapter]] = {}  # family name -> adapter class (filled by `families()`)
MODEL_TYPES: dict[str, type[VLMAdapter]] = {}  # config.model_type -> adapter class


def families() -> dict[str, type[VLMAdapter]]:
    """Every registered family (discovering them on first use)."""
    if not FAMILIES:
        import vlm_grpo.adapters.families as package

        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for obj in vars(module).values():
                if isinstance(obj, type) and issubclass(obj, VLMAdapter) and obj.__module__ == module.__name__ \
                        and "family" in vars(obj):
                    _register(obj)
    return FAMILIES


def image_families() -> dict[str, type[VLMAdapter]]:
    """The families whose models read images (every one but the text-only causal LMs)."""
    return {name: cls for name, cls in families().items() if cls.reads_images}


def _register(adapter_cls: type[VLMAdapter]) -> None:
    if adapter_cls.family in FAMILIES:
        raise ValueError(f"two adapters declare family {adapter_cls.family!r}")
    FAMILIES[adapter_cls.family] = adapter_cls
    for model_type in adapter_cls.model_types:
        MODEL_TYPES.setdefault(model_type, adapter_cls)


def family_class(family: str) -> type[VLMAdapter]:
    if family not in families():
        raise ValueError(f"unknown model family {family!r}; supported families: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[family]


def is_generic_type(name: str) -> bool:
    """A model type of transformers' image-text-to-text mapping that no family file claims."""
    families()
    return name not in FAMILIES and name not in MODEL_TYPES and name in image_text_types()


def adapter_class(name: str) -> type[VLMAdapter]:
    """The adapter of a family name, or of a model type (a family file's, else the generic adapter's)."""
    families()
    if name in FAMILIES:
        return FAMILIES[name]
    if name in MODEL_TYPES:
        return MODEL_TYPES[name]
    if name in image_text_types():
        return generic_adapter_class(name)
    if _serving_family(name) is not None:
        return _serving_family(name)
    raise ValueError(f"unknown model family {name!r}, nor an image-text-to-text model type of transformers "
                     f"(`vlm-grpo families --all` lists them); families: {', '.join(sorted(FAMILIES))}")


def _serving_family(model_type: str, auto_classes=()) -> type[VLMAdapter] | None:
    """A family that claims a whole class of model types by rule (`serves_model_type`), e.g. every causal LM."""
    return next((cls for cls in families().values() if cls.serves_model_type(model_type, auto_classes)), None)


def class_for_model_type(model_type: str, where: str = "", auto_classes=()) -> type[VLMAdapter]:
    """`auto_classes`: the Auto classes the checkpoint's own code provides (config.json's auto_map)."""
    families()
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    if model_type in image_text_types():
        return generic_adapter_class(model_type)
    if _serving_family(model_type, auto_classes) is not None:
        return _serving_family(model_type, auto_classes)
    raise ValueError(
        f"unsupported model_type {model_type!r}{' in ' + where if where else ''}; "
        f"family files serve: {', '.join(sorted(MODEL_TYPES))}; the generic adapter serves any other "
        "image-text-to-text model type of transformers (`vlm-grpo families --all`), and causal_lm any "
        "AutoModelForCausalLM type"
    )


def composer_for(vision_type: str) -> type[VLMAdapter]:
    """The family that composes hybrids from a vision donor of `vision_type` (`Composer.vision_donor_types`)."""
    from vlm_grpo.adapters.assembly import UnsupportedPairing

    composers = [cls for cls in families().values() if getattr(cls, "vision_donor_types", ())]
    for cls in composers:
        if vision_type in cls.vision_donor_types:
            return cls
    raise UnsupportedPairing(f"unsupported vision source model_type {vision_type!r}. Supported: "
                             + "; ".join(cls.pairing for cls in composers))


def all_presets() -> dict[str, type[VLMAdapter]]:
    """preset name -> the adapter class that builds it."""
    return {name: cls for cls in families().values() for name in cls.presets}
