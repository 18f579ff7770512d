"""The supported-families table (README, docs/families.md and `vlm-grpo families`), generated from the adapters."""

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
                ", ".join(cls.model_types) or cls.model_types_note,
                cls.model_class_note or cls.model_class.__name__,
                *(_patterns(cls, g) for g in MODULE_GROUPS),
                ", ".join(f"`{p}`" for p in sorted(cls.presets)) or "-",
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _how(record) -> str:
    paths = [name for name, on in (("shared image features", record.shares_features),
                                   ("shared prompt prefix", record.shares_prefix)) if on]
    return (f"contract suite, cache probe ({record.cache}), 2 GRPO steps pass; faster paths: "
            + (", ".join(paths) if paths else "none (plain path)")
            + (f"; needs the `{record.extra}` extra" if record.extra else ""))


class ModelTypeGone(ValueError):
    """A model type the table was measured with is gone from the installed transformers."""


def model_types_table() -> str:
    """Every image-text-to-text model type of the transformers version measured (the locked one) with its status:
    a family file, the generic adapter (measured, adapters/generic/model_types.json), or not supported and why
    (`vlm-grpo families --all`). The same text under any installed transformers, unless a measured type is gone
    from it: then ModelTypeGone."""
    from vlm_grpo.adapters.generic.status import GENERIC, recorded, recorded_mapping
    from vlm_grpo.adapters.registry import MODEL_TYPES

    families()
    version, records = recorded()
    mapping = recorded_mapping()
    _refuse_gone_types(version, mapping)
    rows, counts = [], {"family file": 0, GENERIC: 0, "not supported": 0}
    for model_type, class_name in sorted(mapping.items()):
        if model_type in MODEL_TYPES:
            status, how = "family file", f"`{MODEL_TYPES[model_type].family}` (contract suite, cache probe, recipes: a covering subset; all with -m recipe_matrix)"
        elif model_type in records and records[model_type].status == GENERIC:
            status, how = GENERIC, _how(records[model_type])
        else:
            status = "not supported"
            how = records[model_type].reason if model_type in records else f"not measured (transformers {version})"
        counts[status] += 1
        rows.append(f"| {model_type} | {class_name} | {status} | {how} |")
    passing = counts["family file"] + counts[GENERIC]
    summary = (f"{passing} of {len(rows)} model types pass ({counts['family file']} with a family file, "
               f"{counts[GENERIC]} through the generic adapter); {counts['not supported']} not supported "
               f"(measured with transformers {version}).")
    head = "| model type | transformers class | status | how / why not |\n| --- | --- | --- | --- |"
    return summary + "\n\n" + head + "\n" + "\n".join(rows)


def untested_model_types() -> dict[str, str]:
    """Model types the installed transformers maps that the measured one did not (type -> class name)."""
    from vlm_grpo.adapters.generic.status import recorded_mapping
    from vlm_grpo.adapters.generic.support import image_text_types

    mapping = recorded_mapping()
    return {t: c for t, c in sorted(image_text_types().items()) if t not in mapping}


def missing_extras_note() -> str:
    """A paragraph naming the passing types whose extra is not installed here, with the command that installs it;
    empty when none is missing."""
    from vlm_grpo.adapters.generic.status import GENERIC, recorded
    from vlm_grpo.adapters.generic.support import missing_extra

    lines = [f"  {t}: {missing_extra(r.extra)}" for t, r in sorted(recorded()[1].items())
             if r.status == GENERIC and r.extra and missing_extra(r.extra)]
    return "\n".join(["Not installed here (the type passes once its extra is in):", "", *lines]) if lines else ""


def untested_note() -> str:
    """A paragraph listing the installed transformers' new model types as untested, with the command that tries
    one; empty when there are none."""
    import transformers

    from vlm_grpo.adapters.generic.status import recorded

    new = untested_model_types()
    if not new:
        return ""
    lines = [f"Untested: {len(new)} model types new in transformers {transformers.__version__} (the table was "
             f"measured with {recorded()[0]}). Try one with `vlm-grpo families --measure TYPE`:", ""]
    lines += [f"- {t} ({c})" for t, c in new.items()]
    return "\n".join(lines)


def _refuse_gone_types(version: str, mapping: dict[str, str]) -> None:
    import transformers

    from vlm_grpo.adapters.generic.support import image_text_types

    gone = sorted(set(mapping) - set(image_text_types()))
    if gone:
        raise ModelTypeGone(f"model types measured with transformers {version} are gone from the installed "
                            f"transformers {transformers.__version__}: {', '.join(gone)}; the families table no "
                            "longer describes this install (re-measure with `vlm-grpo families --measure`)")
