"""Checkpoints of a sharded (FSDP) run: every process writes its own shard of the weights and optimizer state.

torch's distributed checkpoint (DCP) writes `sharded/` inside the checkpoint's temp directory, one file per
process plus its metadata; the main process then adds the scheduler, RNG state, step and manifest and renames the
directory (checkpoint.py's commit), so a sharded checkpoint is as atomic and verifiable as a plain one. Resuming
reads the shards back into the same layout. `final/` stays an ordinary `from_pretrained` checkpoint: the full
state dict is gathered once, onto the main process, and saved from a plain copy of the model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

SHARDS_DIR = "sharded"


def is_sharded_checkpoint(checkpoint: Path) -> bool:
    return (Path(checkpoint) / SHARDS_DIR).is_dir()


def _inner_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper around the torch optimizer


def _state(model: torch.nn.Module, optimizer) -> dict:
    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, _inner_optimizer(optimizer))}


def write_shards(directory: Path, model: torch.nn.Module, optimizer) -> None:
    """Every process writes its shard of `model` (the inner model, not the root unit) and the optimizer."""
    dcp.save(_state(model, optimizer), checkpoint_id=str(Path(directory) / SHARDS_DIR))


def read_shards(checkpoint: Path, model: torch.nn.Module, optimizer) -> None:
    """The shards of `checkpoint` into `model` and `optimizer` (same process count and sharding as written)."""
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(Path(checkpoint) / SHARDS_DIR))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, _inner_optimizer(optimizer), state["optimizer"])


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on the main process (every process must call this; the others get {})."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def shared_temp_dir(run_dir: Path, name: str, is_main: bool) -> Path:
    """A fresh directory every process writes into: made by the main process, seen by all after the barrier."""
    tmp = Path(run_dir) / name
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    return tmp
