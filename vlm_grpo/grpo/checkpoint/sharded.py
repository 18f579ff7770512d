"""Checkpoints of a sharded (FSDP) run: every process writes its own shard of the weights and optimizer state.

torch's distributed checkpoint (DCP) writes `sharded/` inside the checkpoint's temp directory, one file per
process plus its metadata; the main process then adds the scheduler, RNG state, step and manifest and renames the
directory (checkpoint.py's commit), so a sharded checkpoint is as atomic and verifiable as a plain one. Resuming
reads the shards back into the same layout, without running code from them: DCP's `.metadata` (a pickle) is read
first by an unpickler that builds only DCP's own records, and the non-tensor items (e.g. the optimizer's
hyperparameters) as plain data; `--trust-checkpoint` hands both to DCP's own reader (grpo/safe_loading.py).
`final/` stays an ordinary `from_pretrained` checkpoint: the full state dict is gathered once, onto the main
process, and saved from a plain copy of the model.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from vlm_grpo.grpo.safe_loading import UnsafeCheckpointFile, load_records, load_state_file

SHARDS_DIR = "sharded"
METADATA_FILE = ".metadata"  # DCP's name for it
# Everything a DCP metadata pickle may name: DCP's records and the values inside them (dtypes are allowed apart).
METADATA_NAMES = {
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),  # a layout by its name, from a fixed table
    ("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"),  # where the shards were written (a record only)
}


def is_sharded_checkpoint(checkpoint: Path) -> bool:
    return (Path(checkpoint) / SHARDS_DIR).is_dir()


def _inner_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper around the torch optimizer


def _state(model: torch.nn.Module, optimizer) -> dict:
    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, _inner_optimizer(optimizer))}


def write_shards(directory: Path, model: torch.nn.Module, optimizer) -> None:
    """Every process writes its shard of `model` (the inner model, not the root unit) and the optimizer."""
    dcp.save(_state(model, optimizer), checkpoint_id=str(Path(directory) / SHARDS_DIR))


def read_shards(checkpoint: Path, model: torch.nn.Module, optimizer, trust: bool = False) -> None:
    """The shards of `checkpoint` into `model` and `optimizer` (same process count and sharding as written); as
    plain data only unless `trust`."""
    state, shards = _state(model, optimizer), Path(checkpoint) / SHARDS_DIR
    if trust:  # --trust-checkpoint: DCP's own reader, which unpickles in full
        from vlm_grpo.grpo.safe_loading import warn_trusted

        warn_trusted(str(shards))
        dcp.load(state, checkpoint_id=str(shards))
    else:
        metadata = load_records(shards / METADATA_FILE, METADATA_NAMES, Metadata, check=_storage_problem)
        try:
            dcp.load(state, storage_reader=_CheckedReader(shards, metadata), planner=_PlainDataPlanner(shards))
        except CheckpointException as err:  # DCP gathers every process's failure: the first one, in one line
            raise _first_failure(err, shards) from None
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, _inner_optimizer(optimizer), state["optimizer"])


def _storage_problem(metadata: Metadata) -> str | None:
    """What in a metadata record would make the reader open anything but this directory's shard files."""
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            return f"it points at {name!r}, not a shard file of its directory"
        if getattr(info, "transform_descriptors", None):
            return f"it asks for stream transforms {info.transform_descriptors!r}"
    return None


class _CheckedReader(FileSystemReader):
    """DCP's file reader, given the metadata already read by the restricted unpickler (no per-process fallback)."""

    def __init__(self, path: Path, metadata: Metadata):
        super().__init__(path)
        self.checked = metadata

    def read_metadata(self) -> Metadata:
        self.checked.storage_meta = self.checked.storage_meta or StorageMeta()
        self.checked.storage_meta.load_id = self.load_id
        return self.checked


class _PlainDataPlanner(DefaultLoadPlanner):
    """DCP's planner, with the non-tensor items read as plain data (DCP's own unpickles them in full)."""

    def __init__(self, shards: Path):
        super().__init__()
        self.shards = shards

    def load_bytes(self, read_item, value) -> None:
        fqn = read_item.dest_index.fqn
        info = self.metadata.storage_data.get(read_item.storage_index)
        where = f"{self.shards / getattr(info, 'relative_path', '?')} (item {fqn})"
        node: Any = self.original_state_dict
        *parents, last = self.mappings[fqn]  # the item's place in the nested state dict
        for key in parents:
            node = node[key]
        node[last] = load_state_file(value, where=where)


def _first_failure(err: CheckpointException, shards: Path) -> Exception:
    failures = [exc for exc, _trace in err.failures.values()]
    for exc in failures:
        if isinstance(exc, UnsafeCheckpointFile):
            return exc
    for exc in failures:
        if isinstance(exc, pickle.UnpicklingError):  # a tensor entry the weights-only reader refused
            return UnsafeCheckpointFile(str(shards), "a tensor entry names something other than tensor data")
    first = failures[0] if failures else err
    return RuntimeError(f"{shards}: {type(first).__name__}: {str(first).strip().splitlines()[0] if str(first).strip() else ''}")


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on the main process (every process must call this; the others get {})."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def shared_temp_dir(run_dir: Path, name: str, is_main: bool) -> Path:
    """A fresh directory every process writes into: made by the main process, seen by all after the barrier."""
    tmp = Path(run_dir) / name
    if is_main:  # the caller recorded it as the run's; a link there is removed, never followed
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    dist.barrier()
    return tmp
