"""A model made ready to pickle into another process (the asynchronous rollout worker's copy).

A copy that only samples needs none of the trainer's module hooks: its counters and profilers hold handles and
closures that do not pickle, or that unpickle broken (a RemovableHandle whose dicts are gone). transformers 5 also
records hidden states and attentions through forward hooks it installs at a model's first forward
(`transformers.utils.output_capturing`, closures); dropping them with the rest and clearing the "installed" mark
makes the other process install its own at its first forward."""

from __future__ import annotations

import torch

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
              "_forward_hooks_always_called", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
              "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
INSTALLED = "_output_capturing_hooks_installed"  # transformers.utils.output_capturing's mark


def without_hooks(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (a copy: changed in place) with no module hooks, transformers' to be installed again; returned."""
    for module in model.modules():
        for name in HOOK_DICTS:
            hooks = getattr(module, name, None)
            if hooks:
                hooks.clear()
        if getattr(module, INSTALLED, False):
            setattr(module, INSTALLED, False)
    return model


def registered_again(model: torch.nn.Module) -> torch.nn.Module:
    """In the process that unpickled `model`: transformers' registry of what each model class records
    (`_CAN_RECORD_REGISTRY`, filled when a model is constructed, which unpickling does not do) gets its classes
    again; without it a vision tower returns no hidden states to the projector that selects one."""
    try:
        from transformers import PreTrainedModel
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # a transformers without output capturing by hooks
        return model
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            _CAN_RECORD_REGISTRY[module] = module._can_record_outputs
    return model
