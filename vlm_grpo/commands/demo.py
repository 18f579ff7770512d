"""`vlm-grpo demo`: the cache probe and one generation on every family's tiny twin (offline, seconds)."""

from __future__ import annotations

from vlm_grpo.commands import check_cache, generate
from vlm_grpo.commands.model_args import model_namespace


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="offline demo on every tiny twin: cache probe and a generation")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.adapters.registry import families

    failures = 0
    for family in sorted(families()):
        print(f"\n=== tiny:{family} ===")
        ns = model_namespace(
            f"tiny:{family}", device="cpu", steps=16, simulate_quirk=None,
            prompt="How many red triangles are in the image?", image=None, max_new_tokens=12,
        )
        failures += check_cache.run(ns) != 0
        print("sample completion (random weights):", end=" ")
        generate.run(ns)
    return 1 if failures else 0
