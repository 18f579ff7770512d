"""The list of files a run created (`.vlm-grpo-files.json`) cannot be used against the user: it records what the run
wrote there (each entry's inode), and only entries that still match are deleted or replaced. A list shipped with a
folder, or an entry replaced since the run wrote it, names files that are left as they are and named."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.reliability.test_run_dir_links import snapshot
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.directory import prepare_run_dir
from vlm_grpo.grpo.safe_files import CREATED_LIST, CreatedFiles
from vlm_grpo.grpo.setting_fields import SettingError


def _users_folder(tmp_path):
    """The user's own folder: plots of their own and an eval file, beside the run files someone shipped."""
    run = tmp_path / "mine"
    (run / "plots").mkdir(parents=True)
    (run / "plots" / "fig.png").write_bytes(b"my figure")
    (run / "eval-mine.json").write_text('{"mine": 1}\n')
    return run


@pytest.mark.parametrize("shipped", [
    {"files": ["plots", "eval-mine.json"]},  # a list of names alone (the old form)
    {"files": {"plots": None, "eval-mine.json": None}},  # claimed, never recorded
    {"files": {"plots": {"kind": "dir", "dev": 1, "ino": 2}, "eval-mine.json": {"kind": "file", "dev": 1, "ino": 3}}},
])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_shipped_list_cannot_make_a_start_delete_the_users_files(tmp_path, shipped, overwrite):
    run = _users_folder(tmp_path)
    (run / CREATED_LIST).write_text(json.dumps(shipped))
    before = snapshot(run)
    with pytest.raises(SettingError) as refused:
        prepare_run_dir(run, resume=False, overwrite=overwrite)
    message = str(refused.value)
    assert "eval-mine.json, plots" in message and "not the entry a run wrote there" in message, message
    assert "left as they are" in message and snapshot(run) == before
    assert CreatedFiles(run).unverified() == ["eval-mine.json", "plots"] and CreatedFiles(run).names() == set()


def test_a_copied_run_s_list_vouches_for_nothing_but_resume_takes_it_as_yours(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    safe_files.write_run_file(first, "config.yaml", "a: 1\n")
    safe_files.write_run_path(first, "plots/overview.png", b"png")
    assert CreatedFiles(first).names() == {"config.yaml", "plots"}
    copy = tmp_path / "copy"
    shutil.copytree(first, copy)  # new inodes: the list no longer describes these entries
    with pytest.raises(SettingError, match="config.yaml, plots, which no run here created"):
        prepare_run_dir(copy, resume=False, overwrite=True)
    prepare_run_dir(copy, resume=True, overwrite=False).release()  # --resume: the user says the run is theirs
    assert CreatedFiles(copy).names() == {"config.yaml", "plots"} and CreatedFiles(copy).unverified() == []


def test_the_run_s_own_failed_start_is_still_replaced_but_an_entry_replaced_since_is_not(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    safe_files.write_run_file(run, "config.yaml", "a: 1\n")
    prepare_run_dir(run, resume=False, overwrite=False).release()  # a failed start: replaced
    assert not (run / "config.yaml").exists()
    safe_files.write_run_file(run, "config.yaml", "a: 1\n")
    (run / "config.yaml").unlink()
    (run / "config.yaml").write_text("the user's own\n")  # the same name, another file
    with pytest.raises(SettingError, match="config.yaml, which no run here created"):
        prepare_run_dir(run, resume=False, overwrite=False)
    assert (run / "config.yaml").read_text() == "the user's own\n"
    with pytest.raises(safe_files.NotTheRuns, match="config.yaml is not the file this run wrote there"):
        safe_files.write_run_file(run, "config.yaml", "b: 2\n")  # a write in the run never replaces it either
    assert (run / "config.yaml").read_text() == "the user's own\n"


def test_appends_and_files_inside_a_folder_keep_the_entry_the_run_s(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for step in range(3):
        safe_files.append_run_file(run, "metrics.jsonl", f'{{"step": {step}}}\n')
        safe_files.write_run_path(run, f"completions/images/{step}.png", b"x")
        safe_files.write_run_file(run, "config.yaml", f"step: {step}\n")
    assert CreatedFiles(run).names() == {"metrics.jsonl", "completions", "config.yaml"}
    assert CreatedFiles(run).unverified() == []
