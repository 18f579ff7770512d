"""The README's "Losses" and "Advantage estimators" tables, generated from the registries (each part's `summary`,
`paper` and own settings), so a new loss or estimator file appears in them with nothing else
edited. Print them with `python -m vlm_grpo.grpo.algorithm.tables`."""

from __future__ import annotations

from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES
from vlm_grpo.grpo.algorithm.losses import LOSSES


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def losses_table() -> str:
    rows = [_row(["`--loss-type`", "definition", "own settings (default)", "paper"]), _row(["---"] * 4)]
    for name, cls in sorted(LOSSES.items()):
        own = ", ".join(f"`{key}` ({field.default})" for key, field in cls.settings.items()) or "-"
        rows.append(_row([f"`{name}`", cls.summary, own, cls.paper]))
    return "\n".join(rows)


def advantages_table() -> str:
    rows = [_row(["`--advantage`", "definition", "paper"]), _row(["---"] * 3)]
    for name, cls in sorted(ADVANTAGES.items()):
        rows.append(_row([f"`{name}`", cls.summary, cls.paper]))
    return "\n".join(rows)


if __name__ == "__main__":
    print(losses_table(), advantages_table(), sep="\n\n")
