"""Known generation-cache quirks, keyed by model family and transformers version.

An entry here makes the `auto` cache policy skip the KV cache without probing. The probe in
cache_probe.py stays the authority: it catches quirks this table does not know yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class CacheQuirk:
    families: tuple[str, ...]
    transformers: str  # a version specifier, e.g. "<5.0"
    reason: str


KNOWN_CACHE_QUIRKS: tuple[CacheQuirk, ...] = (
    CacheQuirk(
        families=("idefics3", "smolvlm"),
        # The VSR study (seed) saw cached decoding lose the image tokens with a pre-5 transformers;
        # it did not pin the range, so the whole 4.x line is treated as unsafe.
        transformers="<5.0",
        reason="Idefics3 merges image features only when image tokens are in the step's input; cached decode "
        "steps dropped them (the VSR study's no-cache workaround)",
    ),
)


def known_cache_quirk(family: str, transformers_version: str) -> CacheQuirk | None:
    version = Version(transformers_version)
    for quirk in KNOWN_CACHE_QUIRKS:
        if family in quirk.families and version in SpecifierSet(quirk.transformers):
            return quirk
    return None
