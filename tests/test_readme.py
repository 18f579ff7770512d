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


def _between(text: str, name: str) -> str:
    start = text.index(f"<!-- {name}:start -->") + len(f"<!-- {name}:start -->")
    return text[start : text.index(f"<!-- {name}:end -->")].strip()


def test_losses_and_advantages_tables_are_current():
    from vlm_grpo.grpo.algorithm.tables import advantages_table, losses_table

    text = README.read_text()
    hint = "regenerate it with `python -m vlm_grpo.grpo.algorithm.tables`"
    assert _between(text, "losses-table") == losses_table().strip(), hint
    assert _between(text, "advantages-table") == advantages_table().strip(), hint


# Runs the README's loss file as if it sat in the losses folder: the package's search path gets a second folder
# before the package is first imported, so discovery, settings, --help and the training step are the real ones.
_EXAMPLE_RUN = r'''
import importlib.util, sys
from pathlib import Path
import vlm_grpo.grpo.algorithm
real = Path(vlm_grpo.grpo.algorithm.__file__).parent / "losses"
spec = importlib.util.spec_from_file_location("vlm_grpo.grpo.algorithm.losses", real / "__init__.py",
                                              submodule_search_locations=[str(real), sys.argv[1]])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
from vlm_grpo.cli import main
from vlm_grpo.grpo.algorithm.tables import losses_table
from vlm_grpo.grpo.settings.sources import settings_help
assert "| `capped_pg` |" in losses_table() and "pg_ratio_cap" in settings_help()
sys.exit(main(["train", *sys.argv[2:]]))
'''


def test_the_adding_a_loss_example_trains(tmp_path):
    import os
    import re
    import subprocess
    import sys

    from vlm_grpo.grpo.run.logs import read_jsonl

    section = README.read_text().split("### Adding a loss (one file)", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "capped_pg.py").write_text(code)
    out = tmp_path / "run"
    args = ["--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4",
            "--num-generations", "2", "--max-steps", "1", "--logging.progress", "false", "--output-dir", str(out),
            "--data.rewards", "tests.grpo.toy_rewards:lowercase_share", "--loss-type", "capped_pg",
            "--pg-ratio-cap", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(README.parent)}
    done = subprocess.run([sys.executable, "-c", _EXAMPLE_RUN, str(tmp_path / "extra"), *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = read_jsonl(out / "metrics.jsonl")
    assert "capped_fraction" in row and row["grad_norm"] > 0
    assert "pg_ratio_cap: 3.0" in (out / "config.yaml").read_text()
