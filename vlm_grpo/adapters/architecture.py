"""A model size as data: what a family needs to build its model with random weights.

Tiny twins (tests, the offline demo, CPU benchmarks) and real-size presets (GPU benchmarks) are the same
builder fed different records, so a family file declares sizes, not construction code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Architecture:
    vision: Mapping[str, Any]  # vision config fields
    text: Mapping[str, Any]  # language-model config fields
    image: Mapping[str, Any] = field(default_factory=dict)  # image-processor sizing and the config fields tied to it
    vocab_size: int | None = None  # None: the tiny tokenizer's own size; a preset names the real vocabulary
    note: str = ""  # where the numbers come from (a public checkpoint's config)
