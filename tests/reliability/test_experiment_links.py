"""An experiment never writes through a link planted in its output folder: a symlink at any level below output_dir
(the .locks folder, a seed folder, a stage folder, the reports folder) or inside a stage folder is refused before the
stage writes, naming the path, and the link's target stays as it was. output_dir itself may be a link (the user's)."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.reliability.conftest import TOY_EXPERIMENT
from vlm_grpo.experiment.plan import read_experiment
from vlm_grpo.experiment.stage_lock import stage_lock
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.safe_files import UnsafeRunPath



def experiment(tmp_path, out):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(TOY_EXPERIMENT).format(out=out, grpo="", extra=""))
    return read_experiment(path, [])


@pytest.mark.parametrize("link, stage", [
    (".locks", "grpo"), ("seed0", "grpo"), ("seed0/grpo", "grpo"), ("base-seed0", "compose"),
    ("base-seed0/compose", "compose"), ("seed0/sft/final", "sft"), ("seed0/eval", "eval"),
])
def test_a_link_below_the_output_folder_is_refused_before_the_stage_writes(tmp_path, link, stage):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    exp = experiment(tmp_path, tmp_path / "runs")
    planted = exp.output_dir / link
    planted.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, planted)
    with pytest.raises(UnsafeRunPath, match=rf"{planted} is a symlink to {elsewhere}"):
        stage_lock(exp, stage, 0)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"] and (elsewhere / "keep.txt").read_text() == "mine"


def test_the_summary_and_kept_reports_are_never_written_through_a_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exp = experiment(tmp_path, tmp_path / "runs")
    exp.output_dir.mkdir(parents=True)
    os.symlink(elsewhere, exp.output_dir / "reports")
    with pytest.raises(UnsafeRunPath, match="reports is a symlink"):
        safe_files.write_below(exp.output_dir, exp.output_dir / "reports" / "seed0" / "grpo-test.json", "{}")
    os.symlink(elsewhere / "summary.md", exp.output_dir / "summary.md")
    with pytest.raises(UnsafeRunPath, match="summary.md is a symlink"):
        safe_files.write_below(exp.output_dir, exp.output_dir / "summary.md", "table")
    assert list(elsewhere.iterdir()) == []


def test_an_output_folder_that_is_itself_a_link_is_the_users_and_is_used(tmp_path):
    real = tmp_path / "big-disk"
    real.mkdir()
    os.symlink(real, tmp_path / "runs")
    exp = experiment(tmp_path, tmp_path / "runs")
    lock = stage_lock(exp, "grpo", 0)
    lock.acquire()
    lock.release()
    assert (real / ".locks").is_dir() and (real / "seed0").is_dir()
