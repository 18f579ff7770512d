"""Known generation-cache quirks: each family file declares its own (`cache_quirks`, adapters/quirks.py); this
reads them for the cache policy. An entry makes the `auto` policy skip the KV cache without probing; the probe in
cache_probe.py stays the authority and catches quirks no entry knows yet.
"""

from __future__ import annotations

from vlm_grpo.adapters.quirks import CacheQuirk


def known_cache_quirk(adapter, transformers_version: str) -> CacheQuirk | None:
    """The first quirk `adapter` (an adapter or its class) declares for `transformers_version`, if any."""
    for quirk in getattr(adapter, "cache_quirks", ()):
        if quirk.applies(transformers_version):
            return quirk
    return None
