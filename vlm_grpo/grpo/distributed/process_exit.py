"""How a process of a launched run (accelerate, torchrun) ends: with its process group taken down while the
interpreter is whole. Left to interpreter finalization, what still holds the group (a DDP reducer's buckets, FSDP's
mesh, gloo's worker threads with their tensors) is released while the interpreter is being torn down, and the
process can abort ("terminate called without an active exception", SIGABRT) after its run's work is saved -- in a
user's own script as much as in the `vlm-grpo` command."""

from __future__ import annotations

import atexit
import gc

_at_exit = False


def release_group() -> None:
    """Free what holds the process group, then take the group down (a no-op when there is none)."""
    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError):  # already torn down by a failing peer: nothing left to release
            pass
    gc.collect()


def release_group_at_exit() -> None:
    """Once per process: release_group() at exit, before finalization (atexit runs while modules are alive)."""
    global _at_exit
    if not _at_exit:
        atexit.register(release_group)
        _at_exit = True
