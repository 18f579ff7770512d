"""The `--model` syntax, parsed in one place.

    tiny:FAMILY|TYPE     the family's (or model type's) real classes with random weights and a local tokenizer
    preset:NAME          a real-size (or benchmark) architecture with random weights
    pretrained:NAME      a checkpoint shipped inside the package (vlm_grpo/pretrained)
    FAMILY:PATH_OR_HUB   a checkpoint of that family (or model type: the generic adapter serves types without a file)
    PATH_OR_HUB          a checkpoint; the family is read from its config.model_type
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from vlm_grpo.adapters.model_dirs import checkpoint_path
from vlm_grpo.adapters.registry import adapter_class, all_presets, families, is_generic_type


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # tiny | preset | checkpoint
    name: str  # the family or model type (tiny), the preset name (preset), or a directory / hub id (checkpoint)
    family: str | None = None  # checkpoint: the family or type named by FAMILY:PATH; None: read from config.model_type


def parse_model_spec(text: str) -> ModelSpec:
    prefix, sep, rest = text.partition(":")
    if sep and prefix == "tiny":
        adapter_class(rest)  # an unknown family or type is an error listing the known ones
        return ModelSpec("tiny", rest)
    if sep and prefix == "preset":
        presets = all_presets()
        if rest not in presets:
            raise ValueError(f"unknown preset {rest!r}; known presets: {', '.join(sorted(presets))}")
        return ModelSpec("preset", rest)
    if sep and prefix == "pretrained":
        from vlm_grpo import pretrained

        return ModelSpec("checkpoint", str(pretrained.path(rest)))
    if sep and (prefix in families() or is_generic_type(prefix)) and not os.path.isabs(text):
        return ModelSpec("checkpoint", checkpoint_path(rest), family=prefix)
    if sep and not os.path.exists(text):
        raise ValueError(f"unknown model family {prefix!r} in {text!r}; supported families: {', '.join(sorted(families()))}")
    return ModelSpec("checkpoint", checkpoint_path(text))
