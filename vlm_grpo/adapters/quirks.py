"""A known generation-cache quirk: a transformers version range in which a family's cached decoding is wrong.

A family file declares its own (`VLMAdapter.cache_quirks`); the `auto` cache policy (compat/) skips the KV cache
without probing where one applies. The probe stays the authority for everything the entries do not know, and is
the only judge for the generic adapter, which declares none.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class CacheQuirk:
    transformers: str  # a version specifier, e.g. "<5.0"
    reason: str

    def applies(self, transformers_version: str) -> bool:
        return Version(transformers_version) in SpecifierSet(self.transformers)
