"""Which samples a step uses: a pure function of (seed, step, process), so a resumed run sees the same data."""

from __future__ import annotations

import math
from functools import lru_cache

import torch


@lru_cache(maxsize=8)
def _permutation(size: int, seed: int, epoch: int, shuffle: bool = True) -> tuple[int, ...]:
    if not shuffle:
        return tuple(range(size))
    generator = torch.Generator().manual_seed(seed * 7919 + epoch)
    return tuple(torch.randperm(size, generator=generator).tolist())


_TRL_PASSES: dict[tuple[int, int], tuple[torch.Generator, list[tuple[int, ...]]]] = {}


def _trl_permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    """Pass `epoch`'s order as TRL's RepeatSampler draws it: one generator seeded once with `seed`, a new
    permutation from it at each pass (kept, so any step's rows can be looked up again)."""
    generator, passes = _TRL_PASSES.setdefault((size, seed), (torch.Generator().manual_seed(seed), []))
    while len(passes) <= epoch:
        passes.append(tuple(torch.randperm(size, generator=generator).tolist()))
    return passes[epoch]


def batch_indices(size: int, batch_size: int, step: int, seed: int, process_index: int = 0, num_processes: int = 1,
                  shuffle: bool = True, order: str = "reseeded") -> list[int]:
    """Sample indices of one process's prompts at `step`; every process gets distinct prompts (`shuffle` false: each
    pass in row order). `order` "trl": TRL's passes, whole batches only (a pass's partial batch is dropped)."""
    if size <= 0:
        raise ValueError("the training set is empty")
    per_step = batch_size * num_processes
    if order == "trl" and per_step <= size:
        epoch, k = divmod(step, size // per_step)
        rows = _trl_permutation(size, seed, epoch) if shuffle else tuple(range(size))
        start = k * per_step + process_index * batch_size
        return list(rows[start:start + batch_size])
    start = step * batch_size * num_processes + process_index * batch_size
    out = []
    for position in range(start, start + batch_size):
        epoch, offset = divmod(position, size)
        out.append(_permutation(size, seed, epoch, shuffle)[offset])
    return out


def epoch_steps(epochs: float, size: int, prompts_per_step: int) -> int:
    """Steps of a run `epochs` passes long, by TRL's count: a step takes `prompts_per_step` rows (all processes), a
    pass has size // prompts_per_step whole steps (at least 1; a last partial batch is dropped, as TRL's sampler
    does), and a fractional total rounds up (transformers' Trainer)."""
    return max(math.ceil(epochs * max(size // prompts_per_step, 1)), 1)


def step_seed(seed: int, step: int, process_index: int = 0) -> int:
    """The sampling seed of one step on one process (independent of how the run got there)."""
    return (seed * 1_000_003 + step * 7_919 + process_index * 104_729) % (2**31 - 1)


def repeats_note(size: int, per_step: int) -> str | None:
    """A note when a step draws more prompts than the training set holds: rows repeat, in whole shuffled passes
    (epochs), so at any point of the run no row has been drawn more than once more often than another."""
    if size <= 0 or per_step <= size:
        return None
    return (f"note: the training set has {size} rows and a step draws {per_step} prompts: rows repeat within a step "
            f"(about {per_step / size:.1f} times each), in whole shuffled passes (epochs), so over the run every row "
            "is drawn equally often, to within one")
