"""Images shown inside completions: what tools returned during a multi-turn rollout.

A tool turn's text and images are encoded by the adapter like a prompt (`encode_turns`: the processor expands each
image's tokens and the alignment check counts them against the features), and its tokens become part of the
completion. This record keeps the turns' image tensors, once each, and which completion rows show which turns, so
every forward can place a row's images where its tokens are: the prompt's images first, then its turns' in order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.features import ImageFeatures


@dataclass
class CompletionImages:
    turns: PromptBatch  # one sample per tool turn that showed images: its image tensors (tokens are turn-local)
    rows: list[list[int]]  # [N] the turns (samples of `turns`) each completion row shows, in order
    token_types: dict[str, torch.Tensor]  # token-shaped key -> [N, T] its values over the completions (0: text)
    features: ImageFeatures | None = None  # the turns' image features (detached), when the rollout computed them
    policy_features: ImageFeatures | None = None  # the same with gradient (the policy's, taken once for the update)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def images(self) -> int:
        return sum(len(spans) for spans in self.turns.image_spans)

    def select(self, rows: Sequence[int]) -> "CompletionImages":
        """Rows `rows` (in that order) and only the turns they show, renumbered."""
        used = [t for r in rows for t in self.rows[r]]
        where = {t: k for k, t in enumerate(used)}
        index = torch.tensor(list(rows), dtype=torch.long)
        return CompletionImages(
            turns=self.turns.select(used),
            rows=[[where[t] for t in self.rows[r]] for r in rows],
            token_types={k: v[index.to(v.device)] for k, v in self.token_types.items()},
            features=None if self.features is None else self.features.select(used),
            policy_features=None if self.policy_features is None else self.policy_features.select(used),
        )

    def row_features(self, prompt_features: ImageFeatures, turn_features: ImageFeatures) -> ImageFeatures:
        """Each row's image features in sequence order: its prompt's (`prompt_features`, one sample per row), then
        those of the turns it shows (`turn_features`, one sample per turn)."""
        n = len(prompt_features)
        both = ImageFeatures.concat([prompt_features, turn_features])
        return both.gather([[k] + [n + t for t in turns] for k, turns in enumerate(self.rows)])

    def completion_only(self, turn_features: ImageFeatures) -> ImageFeatures:
        """Each row's tool-turn image features alone (a forward over the completion part only)."""
        return turn_features.gather(self.rows)


def with_turn_images(adapter, rows: PromptBatch, turns: CompletionImages | None, pixels: bool = True) -> PromptBatch:
    """`rows` (one prompt per completion row) whose image tensors also hold those of the tool turns each row shows,
    in sequence order; without `pixels`, only what positions need (grids), as `sharing.text_side` keeps."""
    if turns is None:
        return rows
    token_keys = {*rows.token_keys, *turns.turns.token_keys}
    keys = [k for k in dict.fromkeys([*rows.mm, *turns.turns.mm])
            if k not in token_keys and (pixels or k not in adapter.pixel_keys)]
    sources = [[(rows, k)] + [(turns.turns, t) for t in row] for k, row in enumerate(turns.rows)]
    mm, mm_rows = adapter.combine_images(sources, keys)
    for key in rows.token_keys:  # prompt-shaped: kept as they are (the completion's come with the forward)
        mm[key], mm_rows[key] = rows.mm[key], rows.mm_rows[key]
    return replace(rows, mm=mm, mm_rows=mm_rows)
