"""The KV cache's public name, whichever transformers is installed.

transformers 5.24 renamed the `past_key_values` argument and output field to `cache` (the old name warns, and is
announced for removal: 5.40 in model forwards, 6.0 in `generate`). Code that hands a cache over asks the callee's
model's forward which name it takes (`generate` takes the same name, since it hands the cache to the forward), so it
works on both sides of the rename and never spells a deprecated name where the new one exists.
"""

from __future__ import annotations

import functools
import inspect

NEW, OLD = "cache", "past_key_values"


@functools.lru_cache(maxsize=256)
def _keyword_of(signature_owner) -> str:
    try:
        params = inspect.signature(signature_owner).parameters  # follows functools.wraps to the real signature
    except (TypeError, ValueError):
        return OLD
    return NEW if NEW in params else OLD


def cache_keyword(callee) -> str:
    """`cache` where `callee` (a model's forward, bound or not) takes it, else `past_key_values`."""
    return _keyword_of(getattr(callee, "__func__", callee))


def cache_argument(callee, cache) -> dict:
    """`{name: cache}` to pass to `callee` under the name it takes."""
    return {cache_keyword(callee): cache}


def returned_cache(output):
    """The cache a forward returned, under either name (None when it returned none)."""
    cache = getattr(output, NEW, None) if not isinstance(output, dict) else output.get(NEW)
    if cache is not None:
        return cache
    return getattr(output, OLD, None) if not isinstance(output, dict) else output.get(OLD)
