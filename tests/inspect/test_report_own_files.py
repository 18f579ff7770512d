"""report.html, the trackers' tables and the model card read back only the run's own files: a completions.jsonl
that names a picture elsewhere on the disk (absolute, `../`), a symlinked or hard-linked attention.png or
config.yaml, is left out with a note, so a report meant to be mailed carries nothing from outside the run."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from vlm_grpo.grpo import safe_files
from vlm_grpo.inspect import report as rp

SECRET_COLOUR = (12, 34, 56)


@pytest.fixture()
def outside(tmp_path):
    """A private picture and a private text file outside the run directory."""
    home = tmp_path / "home"
    home.mkdir()
    Image.new("RGB", (40, 40), SECRET_COLOUR).save(home / "private.png")
    (home / "notes.txt").write_text("my password is hunter2\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    return home, run


def _rows(run, images):
    row = {"step": 1, "process": 0, "group": 0, "sample_index": 0, "prompt": "p", "completion": "c", "reward": 1.0,
           "rewards": {"r": 1.0}, "advantage": 0.0, "images": images}
    (run / "completions.jsonl").write_text(json.dumps(row) + "\n")


@pytest.mark.parametrize("name", ["absolute", "dotdot", "symlink", "hardlink", "symlinked_folder", "tilde"])
def test_a_picture_from_outside_the_run_is_left_out_with_a_note(outside, name):
    home, run = outside
    (run / "completions").mkdir()
    target = {"absolute": str(home / "private.png"), "dotdot": "../home/private.png", "tilde": "~/private.png"}
    if name == "symlink":
        os.symlink(home / "private.png", run / "completions" / "x.png")
    elif name == "hardlink":
        os.link(home / "private.png", run / "completions" / "x.png")
    elif name == "symlinked_folder":
        os.symlink(home, run / "completions" / "linked")
    rel = target.get(name, "completions/linked/private.png" if name == "symlinked_folder" else "completions/x.png")
    _rows(run, [rel])
    page = rp.build_report(run)
    assert "data:image" not in page.split("id='attention'")[0]  # nothing inlined for the prompt
    assert "Left out, not the run's own files" in page and "not inlined" in page


def test_a_symlinked_attention_picture_and_config_are_left_out(outside):
    home, run = outside
    os.symlink(home / "private.png", run / "attention.png")
    os.symlink(home / "notes.txt", run / "config.yaml")
    page = rp.build_report(run)
    assert "data:image" not in page and "hunter2" not in page
    assert "attention.png goes through a symlink" in page and "config.yaml left out" in page


def test_the_run_s_own_pictures_are_still_inlined(outside):
    _, run = outside
    (run / "completions" / "images").mkdir(parents=True)
    Image.new("RGB", (16, 16), (0, 200, 0)).save(run / "completions" / "images" / "a.png")
    Image.new("RGB", (16, 16), (0, 0, 200)).save(run / "attention.png")
    _rows(run, ["completions/images/a.png"])
    page = rp.build_report(run)
    assert page.count('class="prompt-image" src="data:image/png;base64,') == 2  # among the best, and by step
    assert '<img class="attention-image" src="data:image/png;base64,' in page and "Left out" not in page


def test_the_model_card_copies_only_the_run_s_own_files(outside, tmp_path):
    from vlm_grpo.grpo.run.model_card import write_model_card
    from vlm_grpo.grpo.settings.sources import load_config

    home, run = outside
    (run / "plots").mkdir()
    os.symlink(home / "private.png", run / "plots" / "overview.png")
    os.symlink(home / "notes.txt", run / "config.yaml")
    final = run / "final"
    final.mkdir()
    written = write_model_card(final, run, load_config(None, []), stage="grpo", family="qwen2_5_vl", rewards=[],
                               heldout={}, title="t")
    assert written == ["README.md"] and not (final / "training_curves.png").exists()
    assert "hunter2" not in (final / "README.md").read_text()


def test_a_symlinked_log_is_refused(outside):
    home, run = outside
    os.symlink(home / "notes.txt", run / "completions.jsonl")
    with pytest.raises(safe_files.OutsideRun, match="completions.jsonl goes through a symlink"):
        rp.build_report(run)
