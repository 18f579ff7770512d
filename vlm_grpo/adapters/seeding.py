"""Deterministic random weights: the same seed gives the same tiny twin on every machine."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
