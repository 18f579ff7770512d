"""The supported-families table (README and `vlm-grpo families`), generated from the adapters."""

from __future__ import annotations

from vlm_grpo.adapters.module_groups import MODULE_GROUPS
from vlm_grpo.adapters.registry import families


def _patterns(adapter_cls, group: str) -> str:
    return " ".join(f"`{p}`" for p in adapter_cls.module_layout.patterns()[group]) or "-"


def families_table() -> str:
    head = ["family", "model_type", "transformers class", *MODULE_GROUPS, "presets"]
    rows = [head, ["---"] * len(head)]
    for family, cls in sorted(families().items()):
        rows.append(
            [
                f"`{family}`",
                ", ".join(cls.model_types) or "(via `hybrid:DIR`)",
                cls.model_class.__name__,
                *(_patterns(cls, g) for g in MODULE_GROUPS),
                ", ".join(f"`{p}`" for p in sorted(cls.presets)) or "-",
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)
