"""The README is a front page that keeps its promises: at most 300 lines, the two set-up commands (CI runs the
test one), the families, losses and estimators tables (current: tests/test_docs.py), and a link to each page of
docs/ it summarises."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= 300


def test_two_setup_commands():
    """The set-up section's one code block holds exactly `make demo` and `make test`, the README's only shell block;
    .ci/run runs the test command as written there."""
    text = README.read_text()
    assert text.count("```bash") == 1
    block = text.split("## Set-up", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert commands[1] in [line.strip() for line in ci]


def test_the_front_page_tables_are_there():
    text = README.read_text()
    for name in ("families-table", "losses-table", "advantages-table"):
        start, end = text.index(f"<!-- {name}:start -->"), text.index(f"<!-- {name}:end -->")
        assert text[start:end].count("\n| `") >= 4, name  # rows, not an empty block


def test_the_front_page_links_every_page_of_docs():
    text = README.read_text()
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)[)#]", text))
    assert linked == {p.name for p in (README.parent / "docs").glob("*.md")}
