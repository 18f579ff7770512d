"""Cache policy `auto | cache | no-cache`: may generation use the KV cache for this model?"""

from __future__ import annotations

import logging

import transformers

from vlm_grpo.compat.cache_probe import STEPS, CacheProbeReport, probe_cache
from vlm_grpo.compat.known_quirks import known_cache_quirk
from vlm_grpo.compat.names import POLICIES
log = logging.getLogger(__name__)


def resolve_use_cache(adapter, policy: str = "auto", report: CacheProbeReport | None = None, steps: int = STEPS) -> bool:
    """`cache`/`no-cache` force the choice; `auto` trusts the cache only where it was shown safe.

    `report`: an already-run probe for this model, to avoid probing twice; `steps`: decode steps probed.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown cache policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if policy != "auto":
        return policy == "cache"
    if not getattr(adapter, "reads_images", True):  # the quirks probed here lose images; a text-only model's cache is transformers' own
        return True
    quirk = known_cache_quirk(adapter, transformers.__version__)
    if quirk is not None:
        log.warning("%s: KV cache off (known quirk, transformers %s): %s", adapter.family, quirk.transformers, quirk.reason)
        return False
    report = report or probe_cache(adapter, steps=steps)
    if not report.cache_ok:
        log.warning("%s: KV cache off, the cache probe failed:\n%s", adapter.family, report.table())
    return report.cache_ok
