"""A run directory belongs to one run: a second run into it is refused naming the first, a dead holder's lock is
named and taken over, a failed start is not a run, and unfinished checkpoints an interrupted run left are removed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.conftest import RUN
from vlm_grpo.cli import main
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo.run.directory import remove_leftovers
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.safe_files import CREATED_LIST, CreatedFiles
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

REPO = Path(__file__).resolve().parents[2]
# Another run's process, reduced to what matters here: it takes the run directory's lock and keeps it.
HOLD = """
import pathlib, sys, time
from vlm_grpo.grpo.run.lock import RunLock
run = pathlib.Path(sys.argv[1]); run.mkdir(parents=True, exist_ok=True)
RunLock(run).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_run_is_refused_while_the_first_runs(tmp_path):
    words = [*RUN, "--max-steps", "1", "--output-dir", str(tmp_path)]
    first = GRPOTrainer.from_settings(load_config(overrides=words))
    for again in ([], ["--resume"], ["--overwrite-output-dir"]):  # fresh, resumed or replacing: all wait their turn
        with pytest.raises(SettingError, match=rf"is in use by another run: process {os.getpid()} on "):
            GRPOTrainer.from_settings(load_config(overrides=[*words, *again]))
    trained(first)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]
    trained(GRPOTrainer.from_settings(load_config(overrides=[*words, "--max-steps", "2", "--resume"])))  # released at the end
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_a_locked_directory_names_its_holder_and_a_dead_holder_is_named_then_taken_over(tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["train", *RUN, "--output-dir", str(run), "--resume"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"vlm-grpo train: error: setting 'logging.output_dir': {run} is in use by another run: "
                              f"process {holder.pid} on {socket.gethostname()}, started ")
        assert len(err.splitlines()) == 1 and err.endswith("wait for it to end, stop it, or choose another --output-dir")
        assert sorted(p.name for p in run.iterdir()) == [".run.lock"]  # nothing written by the refused run
    finally:
        holder.kill()  # SIGKILL: it never releases; the OS drops its lock, its record stays
        holder.wait()
    assert main(["train", *RUN, "--max-steps", "1", "--output-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"{run}: took over a stale lock: process {holder.pid} on {socket.gethostname()}" in out
    assert "ended without releasing it (killed or crashed)" in out


def test_a_failed_start_is_not_a_run_and_leftover_temp_checkpoints_are_removed(tmp_path, capsys):
    from tests.reliability import step_rewards

    def broken():
        raise ZeroDivisionError("division by zero")

    run = tmp_path / "run"
    step_rewards.ACTIONS[0] = broken  # the first step fails: nothing trained, nothing to resume
    assert main(["train", *RUN, "--output-dir", str(run)]) == 1
    # raised once, on the batch only: the message shows that error, not a made-up one
    err = capsys.readouterr().err
    assert "reward 'lowercase' (" in err and "step_rewards.py:" in err
    assert "raised ZeroDivisionError: division by zero on the batch (no completion alone), step 1" in err
    assert not ckpt.complete_checkpoints(run) and (run / "config.yaml").is_file()
    leftover = run / ".tmp-checkpoint-3-4242"  # what a kill during a save leaves
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    CreatedFiles(run).record(leftover.name)  # a save records its folder once made: the run's own to remove
    # no --resume, no --overwrite-output-dir: a failed start is not a run to protect
    assert main(["train", *RUN, "--max-steps", "1", "--output-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "removed .tmp-checkpoint-3-4242, an unfinished save of an interrupted run" in out
    assert f"replaced a failed start in {run} (no checkpoint, final model or logged step): config.yaml" in out
    assert not leftover.exists() and [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]


def test_a_checkpoint_caught_between_its_replacement_renames_is_put_back(tmp_path):
    old = tmp_path / ".old-checkpoint-4-123"  # checkpoint-4 renamed aside, its replacement never renamed in
    old.mkdir()
    (old / ckpt.STATE_FILE).write_text('{"step": 4}')
    stale = tmp_path / ".old-checkpoint-2-123"  # replaced whole: checkpoint-2 exists
    stale.mkdir()
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / ".tmp-final").mkdir()
    CreatedFiles(tmp_path).record(old.name, stale.name, "checkpoint-2", ".tmp-final")  # the run's own
    done = remove_leftovers(tmp_path)
    assert done == ["removed .tmp-final, an unfinished save of an interrupted run",
                    "removed .old-checkpoint-2-123, a replaced checkpoint",
                    "restored checkpoint-4 from .old-checkpoint-4-123 (its replacement was interrupted)"]
    assert (tmp_path / "checkpoint-4" / ckpt.STATE_FILE).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [CREATED_LIST, "checkpoint-2", "checkpoint-4"]
    assert CreatedFiles(tmp_path).names() == {"checkpoint-2", "checkpoint-4"}


def test_a_filesystem_without_file_locks_warns_and_runs_unlocked(tmp_path, capsys, monkeypatch):
    import errno

    from vlm_grpo.grpo.run.lock import RunLock

    def no_flock(*_a, **_k):
        raise OSError(errno.ENOSYS, "Function not implemented")

    lock = RunLock(tmp_path)
    monkeypatch.setattr(lock._lock, "acquire", no_flock)
    lock.acquire()
    assert capsys.readouterr().out == (f"warning: the filesystem of {tmp_path} has no file locks: nothing keeps another "
                                       "run out of it\n")
    assert not lock.held
