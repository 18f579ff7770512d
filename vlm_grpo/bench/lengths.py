"""Completion lengths a bench step ends at: the same for every row (the default), or drawn per row from a stated
distribution, so a row shows what the training forwards pay for padding when lengths vary as in real runs.

Lengths are imposed inside `generate()` by a logits processor, in both frameworks alike: EOS is barred before a row's
length and forced at it (the EOS token is the row's last). Each framework draws from its own stream with the same
seed, in row order, one generate() call after another: the same lengths in the same order while both make the same
calls (one per step here), and the same distribution always; the report gives each framework's mean drawn length.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field

import torch

SHAPES = ("fixed", "uniform", "longtail")
SPELLING = "fixed, uniform:LO:HI (every length from LO to HI alike) or longtail:LO:HI (log-uniform: mostly short)"


@dataclass(frozen=True)
class Lengths:
    shape: str = "fixed"
    low: int = 0
    high: int = 0

    @property
    def varies(self) -> bool:
        return self.shape != "fixed"

    def draw(self, rng: random.Random) -> int:
        if self.shape == "uniform":
            return rng.randint(self.low, self.high)
        # log-uniform over [low, high + 1): the lengths' logarithms spread evenly, so short ones dominate
        return min(self.high, int(math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1)))))

    def __str__(self) -> str:
        return "fixed" if not self.varies else f"{self.shape}:{self.low}:{self.high}"


def parse_lengths(text: str, max_new_tokens: int) -> Lengths:
    """`fixed`, `uniform:LO:HI` or `longtail:LO:HI`, with 1 <= LO <= HI <= max_new_tokens."""
    shape, *bounds = text.strip().split(":")
    if shape == "fixed" and not bounds:
        return Lengths()
    if shape not in SHAPES[1:] or len(bounds) != 2 or not all(b.strip().isdigit() for b in bounds):
        raise ValueError(f"--lengths {text!r}: use {SPELLING}")
    low, high = (int(b) for b in bounds)
    if not 1 <= low <= high <= max_new_tokens:
        raise ValueError(f"--lengths {text!r}: need 1 <= LO <= HI <= --max-new-tokens ({max_new_tokens})")
    return Lengths(shape, low, high)


class EndAtLengths:
    """A logits processor for one generate() call: row i ends with EOS as its `lengths[i]`-th token."""

    def __init__(self, lengths: list[int], eos: int):
        self.lengths, self.eos, self.start = torch.tensor(lengths), eos, None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.start is None:
            self.start = input_ids.shape[1]
        made = input_ids.shape[1] - self.start  # tokens each row has so far
        ends = (self.lengths.to(scores.device) - 1) == made
        scores = scores.clone()
        scores[:, self.eos] = float("-inf")  # no row stops on its own before its length
        scores[ends] = float("-inf")
        scores[ends, self.eos] = 0.0
        return scores


@dataclass
class LengthPlan:
    """The stream of drawn lengths, and every length it gave (the bench reports their mean)."""

    lengths: Lengths
    seed: int
    drawn: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def take(self, rows: int) -> list[int]:
        out = [self.lengths.draw(self.rng) for _ in range(rows)]
        self.drawn += out
        return out


def end_generations_at(model: torch.nn.Module, plan: LengthPlan, eos: int) -> None:
    """Every later `model.generate()` call ends its rows at lengths taken from `plan` (rows = input_ids' rows,
    the call's own completions per prompt included)."""
    from transformers import LogitsProcessorList

    generate = model.generate

    @functools.wraps(generate)
    def generate_to_lengths(*args, **kwargs):
        inputs = kwargs.get("input_ids", args[0] if args else None)
        rows = inputs.shape[0] * int(kwargs.get("num_return_sequences") or 1)
        ender = EndAtLengths(plan.take(rows), eos)
        # first: the lengths are decided before any sampler of the caller's turns scores into a draw
        kwargs["logits_processor"] = LogitsProcessorList([ender, *(kwargs.get("logits_processor") or [])])
        return generate(*args, **kwargs)

    model.generate = generate_to_lengths
