"""What every recipe that draws its own samples (shapes, scene_count, compare_counts, count_price, cryptogram,
moving_square, zoom) shares: `size` samples, sample `index` drawn from a random stream of its own, seeded by the
recipe's name, the seed, the split and the index. The same seed gives the same samples whatever the order they are
taken in (a resumed run, another process, an evaluation of one index); the held-out splits draw from far along the
stream, so they never repeat a training sample. A recipe subclasses GeneratedSamples and writes only `draw`:

    @dataclass
    class MyDataset(GeneratedSamples):
        stream = "my_recipe"
        colours: int = 3

        def draw(self, index: int, rng: random.Random) -> Sample: ...
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from vlm_grpo.recipes.base import Sample

# Where each split starts in the stream: test and eval are the same held-out samples, a million on from train.
SPLIT_OFFSETS = {"train": 0, "test": 1_000_003, "eval": 1_000_003}


@dataclass
class GeneratedSamples:
    size: int
    seed: int = 0
    split: str = "train"

    stream: ClassVar[str] = ""  # the recipe's name in the seed string

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < self.size:
            raise IndexError(index)
        return self.draw(index, self.rng(index))

    def draw(self, index: int, rng: random.Random) -> Sample:
        raise NotImplementedError(f"{type(self).__name__} draws no samples: write draw(index, rng)")

    def position(self, index: int) -> str:
        """Sample `index`'s place in the stream: the split's offset plus the index (unknown splits start at 0)."""
        return str(SPLIT_OFFSETS.get(self.split, 0) + index)

    def rng(self, index: int, stream: str | None = None) -> random.Random:
        """The random stream of sample `index`; `stream` names a second one beside the recipe's (e.g. a choice that
        must not move the images)."""
        return random.Random(f"{stream or self.stream}/{self.seed}/{self.position(index)}")
