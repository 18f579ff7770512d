"""The policy's weights as vLLM takes them: under their checkpoint names, LoRA merged; what trainer and server must
agree on (the signature); the policy exported as a checkpoint vLLM loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

import torch

from vlm_grpo.grpo.rollout.vllm.runtime import architecture_of, unwrapped


def pushed_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The policy's weights under its checkpoint names; a LoRA model's deltas merged in (and unmerged after)."""
    lora = hasattr(model, "merge_adapter")
    if lora:
        model.merge_adapter()
    try:
        items = []
        for name, tensor in model.state_dict().items():
            if "lora_" in name:
                continue
            if lora:
                name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            items.append((name, tensor.detach().to("cpu", copy=True)))
    finally:
        if lora:
            model.unmerge_adapter()
    return items


def signature(architecture: str, shapes: Iterable[tuple[str, tuple[int, ...]]]) -> str:
    """What trainer and server must agree on: the architecture and every weight's name and shape."""
    text = json.dumps([architecture, sorted((n, list(s)) for n, s in shapes)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_signature(model: torch.nn.Module) -> str:
    return signature(architecture_of(model), ((n, tuple(t.shape)) for n, t in pushed_weights(model)))


def export_model(adapter, directory: str | Path) -> Path:
    """The policy as a checkpoint vLLM loads (config, float32 safetensors, processor, chat template)."""
    import copy

    directory = Path(directory)
    model = unwrapped(adapter.model)
    if hasattr(adapter.model, "merge_and_unload"):  # LoRA: a merged copy (peft's own merge), the policy untouched
        model = copy.deepcopy(adapter.model).merge_and_unload()
    model = copy.deepcopy(model).to("cpu", torch.float32) if next(model.parameters()).dtype != torch.float32 else model
    model.save_pretrained(directory)
    adapter.processor.save_pretrained(directory)
    return directory


