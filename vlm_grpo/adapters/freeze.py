"""Freeze policies: which parameters train, from the adapter's module groups, LoRA and named presets.

How `apply_freeze` decides whether a parameter trains, in order:
1. the baseline: every parameter trains; on a LoRA-wrapped model only the LoRA matrices do;
2. the groups named in `freeze` (and in the preset's freeze list) are frozen; a group freezes its sub-groups
   (`language` freezes `experts`), a sub-group only itself;
3. a preset with an allow-list (`projector_and_early_lm`) freezes whatever it does not name;
4. `trainable_patterns` (regexes searched in the unwrapped parameter name) unfreeze again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from vlm_grpo.adapters.module_groups import SUB_GROUPS, strip_wrapper_prefix

_LORA_PARAM = re.compile(r"\.lora_[A-Za-z_]+\.")
_PEFT_COPY = re.compile(r"\.(?:modules_to_save\.[^.]+|original_module)\.")  # peft's modules_to_save wrapper
# decoder-block containers across families: `layers.N.` (most decoder LMs), `layer.N.`, `h.N.` (GPT-2), `blocks.N.`
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)\.")


def is_lora_param(name: str) -> bool:
    return bool(_LORA_PARAM.search(name))


def wraps_lora(model: torch.nn.Module) -> bool:
    return any(is_lora_param(n) for n, _ in model.named_parameters())


# ---------------------------------------------------------------- presets
@dataclass(frozen=True)
class FreezePreset:
    """A named freeze policy: groups to freeze and/or an allow-list of parameters that stay trainable."""

    description: str
    freeze: tuple[str, ...] = ()
    # adapter -> predicate over unwrapped parameter names; None: no allow-list
    allow: Callable[..., Callable[[str], bool]] | None = None


def early_lm_allow(adapter, lm_layers: int = 5) -> Callable[[str], bool]:
    """The freeze policy of the "LLM learns to see" recipe (a ViT + 0.5B-LM hybrid, SFT then GRPO): train only
    the projector's output layer (the layout's `projector_output`, else its last Linear), the input embedding
    and the first `lm_layers` decoder layers of the language model. Found from the module layout, not from any
    family's names.

    With tied input/output embeddings the head shares the embedding tensor and so trains too (as in that
    recipe's 0.5B LM); an untied head stays frozen.
    """
    model = adapter.model
    is_output = _projector_output(adapter)
    prefixes = []
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embedding = base.get_input_embeddings()
    emb_names = [_module_name(n) for n, m in model.named_modules() if m is embedding]
    if emb_names:
        prefixes.append(emb_names[0])
    language = [strip_wrapper_prefix(n) for n, _ in model.named_parameters() if adapter.module_group_of(n) == "language"]
    if not any(_LAYER_INDEX.search(n) for n in language):
        raise ValueError(f"freeze preset 'projector_and_early_lm': no numbered decoder layers found in the language model of {adapter.family}")

    def allowed(name: str) -> bool:
        name = strip_wrapper_prefix(name)
        if is_output(name) or any(name.startswith(p + ".") for p in prefixes):
            return True
        if adapter.module_group_of(name) != "language":
            return False
        m = _LAYER_INDEX.search(name)
        return m is not None and int(m.group(1)) < lm_layers

    return allowed


def _projector_output(adapter) -> Callable[[str], bool]:
    """A predicate over unwrapped parameter names: does it belong to the projector's output layer?"""
    declared = adapter.module_layout.projector_output
    names = [strip_wrapper_prefix(n) for n, _ in adapter.model.named_parameters()]
    if declared:
        if not any(re.match(p, n) for p in declared for n in names):
            raise ValueError(f"freeze preset 'projector_and_early_lm': {adapter.family}'s projector_output {declared} matches nothing")
        return lambda name: any(re.match(p, name) for p in declared)
    linears = [
        _module_name(n)
        for n, m in adapter.model.named_modules()
        if isinstance(m, torch.nn.Linear) and n and ".lora_" not in n and adapter.module_group_of(n + ".weight") == "projector"
    ]
    if not linears:
        raise ValueError(f"freeze preset 'projector_and_early_lm': the projector of {adapter.family} has no Linear layer "
                         "and its module layout declares no projector_output")
    last = linears[-1]  # registration order: the output layer is declared last
    return lambda name: name.startswith(last + ".")


def _module_name(name: str) -> str:
    """Unwrapped module name; a LoRA layer's inner `base_layer` stands for the layer itself."""
    name = strip_wrapper_prefix(name)
    return name[: -len(".base_layer")] if name.endswith(".base_layer") else name


# earlier names still read, with a warning: name -> the preset's name now
RENAMED_PRESETS = {"seed_hybrid": "projector_and_early_lm"}

FREEZE_PRESETS: dict[str, FreezePreset] = {
    "projector_and_early_lm": FreezePreset(
        "train the projector's last Linear, the input embedding and LM layers 0-4; freeze the rest",
        allow=early_lm_allow,
    ),
    "vision_frozen": FreezePreset("freeze the vision tower", freeze=("vision",)),
    "lm_only": FreezePreset("freeze the vision tower and the projector", freeze=("vision", "projector")),
}


def apply_freeze(adapter, cfg) -> None:
    """Set `requires_grad` on every parameter of `adapter.model` from `cfg` (the optim section; see the module
    docstring)."""
    model = adapter.model
    wrapped = wraps_lora(model)
    frozen = cfg.frozen_groups()
    empty = [g for g in sorted(frozen & set(SUB_GROUPS))
             if not any(adapter.training_group_of(n) == g for n, _ in model.named_parameters())]
    if empty:
        raise ValueError(f"freeze names {empty}, but {adapter.family} has no such parameters "
                         "(experts: the routers and experts of a mixture-of-experts language model)")
    preset = FREEZE_PRESETS[cfg.freeze_preset] if cfg.freeze_preset else None
    allow = preset.allow(adapter) if preset and preset.allow else None
    patterns = [re.compile(p) for p in cfg.trainable_patterns]
    hits = [0] * len(patterns)
    for name, param in model.named_parameters():
        short = strip_wrapper_prefix(name)
        plain = _PEFT_COPY.sub(".", short)  # a modules_to_save copy or original, named as the module it stands for
        trainable = is_lora_param(short) if wrapped else True
        trainable = trainable and not frozen & {adapter.module_group_of(name), adapter.training_group_of(name)}
        trainable = trainable and (allow is None or allow(short))
        for i, pattern in enumerate(patterns):
            if pattern.search(plain):
                hits[i] += 1
                if wrapped and ".modules_to_save." not in short:
                    if ".original_module." in short:
                        continue  # the reference's copy: never trains
                    raise ValueError(f"{short}: under LoRA a module trained whole must be a trainable copy "
                                     "(apply_lora(..., train_fully=trainable_patterns)), or the reference would "
                                     "move with it and the adapter checkpoint would not hold it")
                trainable = True
        if param.is_floating_point():  # quantized storage (4-bit) can never train
            param.requires_grad_(trainable)
        elif trainable and not wrapped:
            raise ValueError(f"{short} is stored as {param.dtype} and cannot train; freeze it or use LoRA")
    missing = [p.pattern for p, n in zip(patterns, hits) if n == 0]
    if missing:
        raise ValueError(f"trainable_patterns {missing} match no parameter of {adapter.family}")
