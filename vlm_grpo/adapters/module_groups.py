"""Module groups: every parameter of a model belongs to exactly one of `vision`, `projector`, `language`, `head`.

A family declares its layout once, as data (a `ModuleLayout` of regexes matched at the start of parameter
names). Freeze policies, per-module learning rates, default LoRA targets and the vision-call counter all
derive from that one declaration.

Sub-groups refine a group without leaving it: `experts` (the routers and experts of a mixture-of-experts
language model) is part of `language`, so freezing `language` freezes the experts too, while `freeze: [experts]`
or `experts_lr` reach them alone. Every parameter still belongs to exactly one of the four groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

MODULE_GROUPS = ("vision", "projector", "language", "head")
SUB_GROUPS = {"experts": "language"}  # sub-group -> the group that holds it
GROUP_NAMES = MODULE_GROUPS + tuple(SUB_GROUPS)  # what freeze lists and per-group learning rates may name
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class ModuleLayout:
    """Regexes (re.match on the unwrapped parameter name) of each module group."""

    vision: tuple[str, ...]
    projector: tuple[str, ...]
    language: tuple[str, ...]
    head: tuple[str, ...] = (r"lm_head\.",)
    # The projector's output layer (parameter-name regexes), for policies that train only it (`projector_and_early_lm`);
    # empty: the projector's last Linear module (most families register their output layer last).
    projector_output: tuple[str, ...] = ()
    # The `experts` sub-group of `language` (parameter-name regexes): a mixture-of-experts model's routers and
    # experts; empty for a dense language model.
    experts: tuple[str, ...] = ()

    def patterns(self) -> dict[str, tuple[str, ...]]:
        return {group: getattr(self, group) for group in MODULE_GROUPS}

    def group_of(self, name: str, family: str = "") -> str:
        name = strip_wrapper_prefix(name)  # a LoRA-wrapped model's names map to the same groups
        hits = [g for g, pats in self.patterns().items() if any(re.match(p, name) for p in pats)]
        if len(hits) != 1:
            raise ValueError(f"parameter {name!r} matches module groups {hits} of {family or 'this layout'}; expected exactly one")
        return hits[0]

    def training_group_of(self, name: str, family: str = "") -> str:
        """The finest group of a parameter: its sub-group where it has one (`experts`), else its group."""
        group = self.group_of(name, family)
        if not any(re.match(p, strip_wrapper_prefix(name)) for p in self.experts):
            return group
        if group != SUB_GROUPS["experts"]:
            raise ValueError(f"parameter {name!r} matches the experts sub-group of {family or 'this layout'} but "
                             f"belongs to {group}, not {SUB_GROUPS['experts']}")
        return "experts"


# The LLaVA-style classes (LLaVA, InternVL, Gemma 3): vision tower, multi-modal projector, language model.
LLAVA_STYLE = ModuleLayout(
    vision=(r"model\.vision_tower\.",),
    projector=(r"model\.multi_modal_projector\.",),
    language=(r"model\.language_model\.",),
)


def strip_wrapper_prefix(name: str) -> str:
    """A parameter/module name as the unwrapped model spells it (peft prefixes "base_model.model.")."""
    return name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name


def group_parameters(layout: ModuleLayout, model: torch.nn.Module, family: str = "") -> dict[str, list[str]]:
    """group -> parameter names of `model`; every parameter lands in exactly one group."""
    groups: dict[str, list[str]] = {g: [] for g in MODULE_GROUPS}
    for name, _ in model.named_parameters():
        groups[layout.group_of(name, family)].append(name)
    return groups


def vision_module(layout: ModuleLayout, model: torch.nn.Module, family: str = "") -> torch.nn.Module:
    """The vision tower: the deepest module that holds every `vision` parameter (for call counting)."""
    return group_module(layout, model, "vision", family)


def group_module(layout: ModuleLayout, model: torch.nn.Module, group: str, family: str = "") -> torch.nn.Module:
    """The deepest module that holds every parameter of module group `group` (for call counting and timing)."""
    names = [n.split(".")[:-1] for n, _ in model.named_parameters() if layout.group_of(n, family) == group]
    if not names:
        raise ValueError(f"{family}: no {group} parameters")
    prefix = names[0]
    for parts in names[1:]:
        k = 0
        while k < min(len(prefix), len(parts)) and prefix[k] == parts[k]:
            k += 1
        prefix = prefix[:k]
    return model.get_submodule(".".join(prefix))
