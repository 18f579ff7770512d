"""The tables that README.md and the pages of docs/ hold between `<!-- NAME:start -->` and `<!-- NAME:end -->`,
each generated from the code: the family registry and the measured model types, the loss and estimator
registries. `python -m vlm_grpo.commands.docs_tables` rewrites every such block in README.md and docs/*.md of the
repository it runs in; tests/test_docs.py fails while one is stale."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable


def blocks() -> dict[str, Callable[[], str]]:
    """Block name -> its generator (imported when asked: the generators load the registries)."""
    from vlm_grpo.adapters.families_table import families_table, model_types_table
    from vlm_grpo.grpo.algorithm.tables import advantages_table, losses_table

    return {"families-table": families_table, "model-types-table": model_types_table,
            "losses-table": losses_table, "advantages-table": advantages_table}


def render(text: str) -> str:
    """`text` with each generated block it holds replaced by the generator's output."""
    for name, generate in blocks().items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(\n<!-- {name}:end -->)", re.S)
        if pattern.search(text):
            table = generate().strip()
            text = pattern.sub(lambda m: m.group(1) + table + m.group(2), text)
    return text


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(root: Path) -> list[Path]:
    """Rewrite the stale blocks of README.md and docs/*.md under `root`; the files changed."""
    changed = []
    for path in pages(root):
        text = path.read_text()
        new = render(text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    for path in main(root):
        print(f"rewrote {path}")
