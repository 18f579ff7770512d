"""A run directory shipped by someone else cannot make a run write outside it: a symlink or hard-linked file where a
run file or folder goes is refused on start and on resume (exit 2, naming the path and its target), and every
target stays byte for byte as it was. A user's file with a run file's name is never deleted or rewritten."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
import torch

from tests.reliability.conftest import RUN
from vlm_grpo.cli import main
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.directory import prepare_run_dir
from vlm_grpo.grpo.run.logs import RunLog
from vlm_grpo.grpo.safe_files import CREATED_LIST, CreatedFiles, UnsafeRunPath
from vlm_grpo.grpo.setting_fields import SettingError


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (links not followed) by its bytes' sha256; a link by where it points."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[str(p.relative_to(root))] = "-> " + os.readlink(p)
            elif p.is_file():
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def shipped_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run directory someone shipped (it lists its files, holds a checkpoint) and a folder outside it holding the
    files the links point at."""
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_text("the user's own file\n")
    (outside / "victim-dir").mkdir()
    (outside / "victim-dir" / "keep.bin").write_bytes(b"\x00\x01")
    step = run / "checkpoint-1"
    step.mkdir()
    (step / ckpt.STATE_FILE).write_text('{"global_step": 1, "log_history": []}')
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    CreatedFiles(run).record("checkpoint-1", "metrics.jsonl")
    return run, outside


LINKS = {  # where the link goes in the run directory -> what it points at (a file, or a folder)
    "config.yaml": "victim.txt", "metrics.jsonl": "victim.txt", "completions.jsonl": "victim.txt",
    "reward-audit.json": "victim.txt", ".write-test": "victim.txt", ".run.lock": "victim.txt",
    CREATED_LIST: "victim.txt", "checkpoint-2": "victim-dir", "final": "victim-dir", ".tmp-final": "victim-dir",
    ".tmp-checkpoint-3-99": "victim-dir", "plots": "victim-dir", "checkpoint-1/optimizer.pt": "victim.txt",
}


@pytest.mark.parametrize("resume", [False, True], ids=["start", "resume"])
@pytest.mark.parametrize("name", list(LINKS))
def test_a_symlink_where_a_run_file_goes_is_refused_and_its_target_unchanged(tmp_path, name, resume):
    run, outside = shipped_run(tmp_path)
    target = outside / LINKS[name]
    link = run / name
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeRunPath) as refused:
        prepare_run_dir(run, resume=resume, overwrite=True)
    message = str(refused.value)
    assert f"{link} is a symlink to {target}" in message and "\n" not in message
    assert snapshot(tmp_path) == before  # nothing written, nothing removed, on either side of the link


@pytest.mark.parametrize("resume", [False, True], ids=["start", "resume"])
def test_a_hard_linked_metrics_file_is_refused(tmp_path, resume):
    run, outside = shipped_run(tmp_path)
    (run / "metrics.jsonl").unlink()
    os.link(outside / "victim.txt", run / "metrics.jsonl")
    before = snapshot(tmp_path)
    with pytest.raises(UnsafeRunPath, match="metrics.jsonl is a hard-linked file \\(2 links"):
        prepare_run_dir(run, resume=resume, overwrite=False)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("extra", [[], ["--resume"]], ids=["start", "resume"])
def test_the_command_exits_2_naming_the_link(tmp_path, capsys, extra):
    run, outside = shipped_run(tmp_path)
    (run / "config.yaml").symlink_to(outside / "victim.txt")
    before = snapshot(tmp_path)
    assert main(["train", *RUN, "--max-steps", "1", "--output-dir", str(run), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{run / 'config.yaml'} is a symlink to {outside / 'victim.txt'}" in err
    assert snapshot(tmp_path) == before


def test_writes_never_go_through_a_link_even_one_made_after_the_start(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(UnsafeRunPath):
        RunLog(run).metrics({"step": 1})  # an append: O_NOFOLLOW
    with pytest.raises(UnsafeRunPath):
        safe_files.write_file(run / "metrics.jsonl", "x")  # a whole-file write
    (run / "metrics.jsonl").unlink()
    os.link(victim, run / "metrics.jsonl")
    with pytest.raises(UnsafeRunPath, match="hard-linked"):
        RunLog(run).metrics({"step": 1})
    assert victim.read_text() == "mine\n"
    (run / "metrics.jsonl").unlink()
    RunLog(run).metrics({"step": 1})  # a plain file: written, and recorded as the run's
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n' and "metrics.jsonl" in CreatedFiles(run).names()
    assert not [p for p in run.iterdir() if p.name.startswith(safe_files.STAGING_PREFIX)]


# ---------------------------------------------------------------- files the run did not create (issue 36, item 3)
def test_a_users_metrics_file_is_never_deleted(tmp_path):
    run = tmp_path / "mine"
    run.mkdir()
    (run / "metrics.jsonl").write_text("my own numbers\n")
    (run / "notes.txt").write_text("notes\n")
    before = snapshot(run)
    with pytest.raises(SettingError, match="is not empty and holds no vlm-grpo run"):
        prepare_run_dir(run, resume=False, overwrite=False)
    with pytest.raises(SettingError, match="holds metrics.jsonl, which no run here created"):
        prepare_run_dir(run, resume=False, overwrite=True)  # --overwrite-output-dir never replaces a user's file
    assert snapshot(run) == before


def test_a_non_empty_folder_is_refused_unless_overwrite_or_resume_and_its_files_stay(tmp_path):
    run = tmp_path / "mine"
    run.mkdir()
    (run / "notes.txt").write_text("notes\n")
    with pytest.raises(SettingError, match="--overwrite-output-dir to write there anyway"):
        prepare_run_dir(run, resume=False, overwrite=False)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # refused before anything was made
    prepare_run_dir(run, resume=False, overwrite=True).release()
    assert (run / "notes.txt").read_text() == "notes\n" and CreatedFiles(run).names() == set()
    # a failed start there is replaced by the next run: only what that start created goes
    safe_files.write_run_file(run, "config.yaml", "a: 1\n")
    prepare_run_dir(run, resume=False, overwrite=False).release()
    assert not (run / "config.yaml").exists() and (run / "notes.txt").read_text() == "notes\n"


# ---------------------------------------------------------------- disk full (issue 36, item 6a)
class _Model(torch.nn.Linear):
    def save_pretrained(self, out, **_):
        torch.save(self.state_dict(), Path(out) / "weights.pt")


class _Processor:
    def save_pretrained(self, out):
        (Path(out) / "processor.json").write_text("{}")


class _Adapter:
    def __init__(self):
        self.model, self.processor = _Model(4, 4), _Processor()


def test_disk_full_while_saving_names_the_path_and_space_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    prepare_run_dir(run, resume=False, overwrite=False).release()
    adapter = _Adapter()
    optimizer = torch.optim.AdamW(adapter.model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    first = ckpt.save_checkpoint(run, 1, adapter, optimizer, scheduler, {"config": {}})
    before = snapshot(first)
    real_save = torch.save

    def full(obj, path, *a, **k):
        if Path(path).name == "optimizer.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(safe_files.DiskFull) as refused:
        ckpt.save_checkpoint(run, 2, adapter, optimizer, scheduler, {"config": {}})
    message = str(refused.value)
    assert f"disk full while saving {run / '.tmp-checkpoint-2-'}" in message and "a checkpoint needs about" in message
    assert "are free; the previous checkpoint is kept" in message and "\n" not in message
    assert snapshot(first) == before and not ckpt.verify(first)  # the previous checkpoint, whole
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".run")) == [CREATED_LIST, "checkpoint-1"]
    assert CreatedFiles(run).names() == {"checkpoint-1"}


def test_disk_full_during_a_run_exits_1_in_one_line_with_the_earlier_checkpoint_kept(tmp_path, monkeypatch, capsys):
    real = ckpt.write_states

    def full(folder, step, state):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(folder, step, state)

    monkeypatch.setattr(ckpt, "write_states", full)
    run = tmp_path / "run"
    assert main(["train", *RUN, "--max-steps", "3", "--save-every", "1", "--output-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert "disk full while saving" in err and "the previous checkpoint is kept" in err
    assert [p.name for p in sorted(run.glob("checkpoint-*"))] == ["checkpoint-1"] and not ckpt.verify(run / "checkpoint-1")
    assert not list(run.glob(".tmp-*"))
