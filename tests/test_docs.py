"""README.md and the pages of docs/ hold together: every relative link and anchor resolves, and every table they
hold between generator markers is the generator's current output (`python -m vlm_grpo.commands.docs_tables`)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from vlm_grpo.commands.docs_tables import blocks, pages, render

ROOT = Path(__file__).resolve().parents[1]
PAGES = pages(ROOT)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (where brackets are code, not links)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces ->
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings
    return found


def test_slugs_are_github_s():
    assert slug("Hybrids: `vlm-grpo compose`") == "hybrids-vlm-grpo-compose"
    assert slug("Tools: multi-turn rollouts where the model calls functions") == \
        "tools-multi-turn-rollouts-where-the-model-calls-functions"
    assert slug("Adding a loss (one file)") == "adding-a-loss-one-file"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    links = LINK.findall(prose(page.read_text()))
    for target in links:
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {file.name}")
    assert broken == [], f"{page.name}: {broken}"


def test_the_link_check_sees_links():
    readme = prose((ROOT / "README.md").read_text())
    assert "docs/algorithms.md" in LINK.findall(readme) and "docs/families.md" in LINK.findall(readme)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_generated_tables_are_current(page):
    text = page.read_text()
    assert render(text) == text, "regenerate them: python -m vlm_grpo.commands.docs_tables"


def test_each_generated_table_has_its_place():
    homes = {"families-table": ["README.md", "families.md"], "model-types-table": ["families.md"],
             "losses-table": ["README.md", "algorithms.md"], "advantages-table": ["README.md", "algorithms.md"]}
    assert set(homes) == set(blocks())
    for name, files in homes.items():
        for file in files:
            text = next(p for p in PAGES if p.name == file).read_text()
            assert f"<!-- {name}:start -->" in text and f"<!-- {name}:end -->" in text, (name, file)


# Runs docs/algorithms.md's loss file as if it sat in the losses folder (tests/extra_losses.py), so discovery,
# settings, --help, the tables and the training step are the real ones.
_EXAMPLE_RUN = r'''
import sys
from tests.extra_losses import add_loss_folder
add_loss_folder(sys.argv[1])
from vlm_grpo.cli import main
from vlm_grpo.grpo.algorithm.tables import losses_table
from vlm_grpo.grpo.settings.sources import settings_help
assert "| `capped_pg` |" in losses_table() and "capped_pg" in settings_help()
sys.exit(main(["train", *sys.argv[2:]]))
'''


def test_the_adding_a_loss_example_trains(tmp_path):
    import os
    import subprocess
    import sys

    from vlm_grpo.grpo.run.logs import read_jsonl

    section = (ROOT / "docs" / "algorithms.md").read_text().split("## Adding a loss (one file)", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "capped_pg.py").write_text(code)
    out = tmp_path / "run"
    args = ["--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4",
            "--num-generations", "2", "--max-steps", "1", "--logging.progress", "false", "--output-dir", str(out),
            "--data.rewards", "tests.grpo.toy_rewards:lowercase_share", "--loss-type", "capped_pg"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _EXAMPLE_RUN, str(tmp_path / "extra"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = read_jsonl(out / "metrics.jsonl")
    assert "capped_fraction" in row and row["grad_norm"] > 0
    assert "loss_type: capped_pg" in (out / "config.yaml").read_text()


def test_the_cli_reference_lists_every_command():
    from vlm_grpo.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    text = (ROOT / "docs" / "cli.md").read_text()
    missing = [name for name in sub.choices if f"| `vlm-grpo {name}` |" not in text]
    assert sub.choices and missing == []
