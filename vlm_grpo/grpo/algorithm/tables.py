"""The tables of losses and advantage estimators (README.md, docs/algorithms.md), generated from the registries (each
part's `summary`, `paper`, TRL counterpart and own settings), so a new loss or estimator file appears in them with
nothing else edited. `python -m vlm_grpo.commands.docs_tables` writes them into the pages; this module prints them."""

from __future__ import annotations

from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES
from vlm_grpo.grpo.algorithm.losses import LOSSES
from vlm_grpo.grpo.algorithm.losses.config import LOSS_FIELDS


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def losses_table() -> str:
    rows = [_row(["`--loss-type`", "definition", "own settings (default)", "TRL 1.16", "paper"]), _row(["---"] * 5)]
    for name, cls in sorted(LOSSES.items()):
        own = ", ".join(f"`{key}` ({LOSS_FIELDS[key].default})" for key in cls.settings) or "-"
        trl = f"`{cls.trl_loss_type}`" if cls.trl_loss_type else "-"
        rows.append(_row([f"`{name}`", cls.summary, own, trl, cls.paper]))
    return "\n".join(rows)


def advantages_table() -> str:
    rows = [_row(["`--advantage`", "definition", "paper"]), _row(["---"] * 3)]
    for name, cls in sorted(ADVANTAGES.items()):
        rows.append(_row([f"`{name}`", cls.summary, cls.paper]))
    return "\n".join(rows)


if __name__ == "__main__":
    print(losses_table(), advantages_table(), sep="\n\n")
