"""FSDP2 full sharding of the policy (and of a reference copy) with torch's `fully_shard`.

Each transformer block (the classes a model lists in `_no_split_modules`, and every block transformers can
checkpoint) becomes its own shard unit; what is left (embeddings, LM head, patch embedding, projector) belongs
to a root unit, `ShardedModel`. Everything the loop does with the model runs inside the root's forward
(`model(fn)` calls `fn(inner_model)`): the image encoder, the shared prompt and the LM head are called on
their own, outside the model's forward, and only inside the root's forward are the root's parameters gathered.

Generation and the held-out evaluation run on gathered weights (`gathered`): every unit is unsharded once, no
unit reshards after its forward, and the full weights are freed when the block ends. Inside it no collective
runs, so processes may generate different numbers of tokens.

accelerate applies FSDP only to GPU processes; these calls are the same on CPU (gloo) and GPU (NCCL), so a run
launched with accelerate's FSDP options (`--use_fsdp --fsdp_version 2`) or with `--fsdp full_shard` shards the
same way on both.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import torch
from torch import nn

MODES = ("no", "full_shard", "shard_grad_op")  # shard_grad_op: keep each block's weights gathered until backward


class ShardedModel(nn.Module):
    """The root shard unit: `model(fn, *args)` runs `fn(inner_model, *args)` inside the root's forward."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        return fn(self.module, *args, **kwargs)


def is_sharded(model: nn.Module | None) -> bool:
    return isinstance(model, ShardedModel)


def run(model: nn.Module, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """`fn(model)` for a plain or DDP-wrapped model; inside the root's forward for a sharded one."""
    return model(fn, *args, **kwargs) if is_sharded(model) else fn(model, *args, **kwargs)


def requested_mode(setting: str, accelerator) -> str:
    """The sharding a run asked for: the `fsdp` setting, or else accelerate's FSDP options (a config file or
    `accelerate launch --use_fsdp`, which accelerate itself honours on GPUs only)."""
    if setting != "no":
        return setting
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        from accelerate.utils import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin()  # reads accelerate launch's FSDP_* variables
    if plugin is None:
        return "no"
    if plugin.fsdp_version != 2:
        raise ValueError(f"accelerate's FSDP version {plugin.fsdp_version} is not supported: use fsdp_version 2 "
                         "(accelerate launch --use_fsdp --fsdp_version 2), torch's fully_shard")
    return "full_shard" if plugin.reshard_after_forward in (True, "FULL_SHARD", "full_shard") else "shard_grad_op"


def _block_classes(model: nn.Module) -> set[str]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
        if isinstance(module, GradientCheckpointingLayer):
            names.add(type(module).__name__)
    return names


def shard(model: nn.Module, mode: str = "full_shard") -> ShardedModel:
    """Shard `model` in place across the default process group; returns its root unit."""
    from torch.distributed.fsdp import fully_shard

    if mode not in MODES[1:]:
        raise ValueError(f"fsdp mode {mode!r}: expected one of {MODES[1:]}")
    if not torch.distributed.is_initialized():
        raise ValueError("fsdp needs several processes: launch with `accelerate launch --num_processes N` or torchrun")
    reshard = mode == "full_shard"
    blocks = _block_classes(model)
    # Children before parents: a unit owns the parameters no inner unit took.
    for module in reversed(list(model.modules())):
        if type(module).__name__ in blocks:
            fully_shard(module, reshard_after_forward=reshard)
    root = ShardedModel(model)
    fully_shard(root, reshard_after_forward=reshard)
    root.reshard_blocks = reshard
    return root


def _units(model: ShardedModel) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: nn.Module | None) -> Iterator[None]:
    """Full weights in every unit for the block (generation, evaluation, saving); resharded and freed after it.
    A model that is not sharded passes through."""
    if not is_sharded(model):
        yield
        return
    units = _units(model)
    model.set_reshard_after_forward(False)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        for unit in units:
            unit.set_reshard_after_forward(model.reshard_blocks and unit is not model, recurse=False)


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Gradient accumulation on a sharded model: keep this micro-batch's gradients local (no reduce-scatter)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a shard (a collective: every process calls it), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
