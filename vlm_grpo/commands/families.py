"""`vlm-grpo families`: supported families, model types, module groups and presets (the README table)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("families", help="supported families, model types, module groups and presets")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.adapters.families_table import families_table

    print(families_table())
    return 0
