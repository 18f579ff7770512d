"""The README keeps its promises: the two set-up commands, and a families table that matches the code."""

from pathlib import Path

from vlm_grpo.adapters.families_table import families_table, model_types_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_families_table_is_current():
    text = README.read_text()
    start = text.index("<!-- families-table:start -->") + len("<!-- families-table:start -->")
    end = text.index("<!-- families-table:end -->")
    assert text[start:end].strip() == families_table().strip(), "regenerate it with `vlm-grpo families`"


def test_model_types_table_is_current():
    """README's table of every image-text-to-text model type is `vlm-grpo families --all`, count included."""
    text = README.read_text()
    start = text.index("<!-- model-types-table:start -->") + len("<!-- model-types-table:start -->")
    end = text.index("<!-- model-types-table:end -->")
    assert text[start:end].strip() == model_types_table().strip(), "regenerate it with `vlm-grpo families --all`"


def test_two_setup_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in ci
