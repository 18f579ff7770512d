"""Module groups found from a model's own structure: its vision tower, its projector, its language model, its head.

The names are the ones transformers' image-text-to-text classes use for those parts (data below, no model type
named). A projector nested inside the vision tower (a merger) is the projector, not vision. A parameter that
lands in no group, or a model with no vision, projector or language part, is refused naming what is missing;
a projector-named module that holds a projector of its own (Gemma 4 unified's `embed_vision`: patch layers, then a
`multimodal_embedder`) is a vision stem followed by that projector;
`model.module_groups` (regexes per group) replaces any group the structure gets wrong.
"""

from __future__ import annotations

import re

import torch

from vlm_grpo.adapters.module_groups import MODULE_GROUPS, ModuleLayout

# another modality's encoder and embedder (Gemma 3n's audio tower) join vision and projector: the groups are
# encoders / their bridges into the LM / the LM / the head, and image-text training never feeds them
VISION_NAMES = ("vision_tower", "audio_tower", "visual", "vision_model", "vision_encoder", "image_tower", "video_tower",
                "high_res_vision_model",
                "vision_backbone", "image_encoder", "vit")
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "aligner", "projector", "mm_projector", "merger",
                   "language_projection", "vision_projection", "image_to_text_projection", "vision_adapter",
                   "resampler_model", "vision_resampler", "high_res_vision_neck", "high_res_vision_proj",
                   "deepstack_merger_list", "image_newline", "perception_emb_norm", "mlp1", "visual_embeddings_table",
                   "embed_vision", "embed_audio", "multimodal_embedder", "high_res_vision_alpha")
LANGUAGE_NAMES = ("language_model", "text_model", "llm")
HEAD_NAMES = ("lm_head",)
BASE_NAMES = ("model",)  # the base model under the head class


class UngroupedModules(ValueError):
    """Parameters of a model fall in no module group (or a group is empty)."""


def _children(module: torch.nn.Module) -> list[str]:
    """Direct child modules and direct parameters of `module`."""
    return [n for n, _ in module.named_children()] + [n for n, _ in module.named_parameters(recurse=False)]


def _prefix(path: list[str]) -> str:
    return "".join(re.escape(p) + r"\." for p in path)


def discover_layout(model: torch.nn.Module) -> ModuleLayout:
    """The groups the structure names (unchecked: `check_layout` says what they miss)."""
    groups: dict[str, list[str]] = {g: [] for g in MODULE_GROUPS}
    _collect(model, [], groups)
    return ModuleLayout(**{g: tuple(p) for g, p in groups.items()})


def _collect(module: torch.nn.Module, path: list[str], groups: dict[str, list[str]]) -> None:
    for name in _children(module):
        child = getattr(module, name)
        if name in BASE_NAMES and not path and isinstance(child, torch.nn.Module):
            _collect(child, [name], groups)
        elif isinstance(child, torch.nn.Module) and (name in VISION_NAMES or (
                name in PROJECTOR_NAMES and any(n in PROJECTOR_NAMES for n in _children(child)))):
            inner = [n for n in _children(child) if n in PROJECTOR_NAMES]
            avoid = "".join(f"(?!{re.escape(n)}\\.)" for n in inner)
            groups["vision"].append(_prefix(path + [name]) + avoid)
            groups["projector"] += [_prefix(path + [name, n]) for n in inner]
        elif name in PROJECTOR_NAMES:
            groups["projector"].append(_prefix(path + [name]) if isinstance(child, torch.nn.Module)
                                       else re.escape(".".join(path + [name])) + "$")
        elif name in LANGUAGE_NAMES:
            groups["language"].append(_prefix(path + [name]))
        elif name in HEAD_NAMES:
            groups["head"].append(_prefix(path + [name]))


def check_layout(layout: ModuleLayout, model: torch.nn.Module, model_type: str) -> None:
    """Every parameter in exactly one group and the vision, projector and language groups not empty."""
    patterns = layout.patterns()
    stray: dict[str, list[str]] = {}
    counts = {g: 0 for g in MODULE_GROUPS}
    for name, _ in model.named_parameters():
        hits = [g for g, pats in patterns.items() if any(re.match(p, name) for p in pats)]
        if len(hits) == 1:
            counts[hits[0]] += 1
            continue
        module = name.rsplit(".", 1)[0] if "." in name else name
        key = module.split(".")[1] if module.startswith("model.") and module.count(".") else module.split(".")[0]
        stray.setdefault(f"{key} ({'no group' if not hits else 'groups ' + '+'.join(hits)})", []).append(name)
    if stray:
        parts = ", ".join(f"{k}: {len(v)} parameters, e.g. {v[0]}" for k, v in sorted(stray.items()))
        raise UngroupedModules(f"{model_type}: parameters outside the module groups vision/projector/language/head: "
                               f"{parts}; pass model.module_groups to place them")
    empty = [g for g in ("vision", "projector", "language") if not counts[g]]
    if empty:
        raise UngroupedModules(f"{model_type}: no {' / '.join(empty)} module found in the model's structure (children: "
                               f"{', '.join(_children(model))}); pass model.module_groups to name them")


def with_overrides(layout: ModuleLayout, overrides: dict[str, list[str]] | None) -> ModuleLayout:
    """`layout` with the groups named in `overrides` replaced by the given regexes."""
    if not overrides:
        return layout
    unknown = sorted(set(overrides) - set(MODULE_GROUPS))
    if unknown:
        raise ValueError(f"model.module_groups: unknown group(s) {unknown}; groups are {', '.join(MODULE_GROUPS)}")
    fields = {g: tuple(overrides[g]) if g in overrides else getattr(layout, g) for g in MODULE_GROUPS}
    return ModuleLayout(**fields, projector_output=layout.projector_output)
