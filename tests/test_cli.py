"""The command line answers `--help` and `--version` without loading torch or transformers (command modules import
nothing heavy at the top), lists every setting under `train --help`, and `env` says what a bug report needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vlm_grpo import __version__
from vlm_grpo.adapters.registry import families
from vlm_grpo.cli import main

LIGHT = """
import sys
from vlm_grpo.cli import main
for words in (["--help"], ["--version"]):
    try:
        main(words)
    except SystemExit:
        pass
heavy = sorted(m for m in ("torch", "transformers", "datasets", "peft", "accelerate") if m in sys.modules)
print("heavy:", heavy, file=sys.stderr)
"""


def test_help_and_version_load_nothing_heavy():
    done = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "heavy: []" in done.stderr
    assert f"vlm-grpo {__version__}" in done.stdout and "env" in done.stdout and "train" in done.stdout


def test_train_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--data.dataset_split" in out and "--data.reward_models" in out and "--loss.loss_type" in out


def test_env_names_versions_device_and_each_familys_cache_policy(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    from importlib.metadata import version

    import transformers

    assert out.startswith(f"vlm-grpo {__version__}\n")
    assert f"  torch: {version('torch')}" in out and f"  transformers: {transformers.__version__}" in out
    assert f"KV cache policy per family (transformers {transformers.__version__}):" in out
    assert all(f"  {family} " in out for family in families())
