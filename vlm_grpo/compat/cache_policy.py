"""Placeholder replaced shortly by the real policy (being written now)."""


def resolve_use_cache(adapter, policy: str) -> bool:
    return policy != "no-cache"
