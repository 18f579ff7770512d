"""Faults lose nothing: SIGKILL mid-checkpoint leaves only complete checkpoints, SIGTERM saves, bad output dirs fail early."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo.training import preflight
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

REPO = Path(__file__).resolve().parents[2]
RUN = ["--model", "tiny:qwen2_5_vl", "--learning-rate", "1e-3", "--data.recipe_options", "{image_size: 56}",
       "--max-new-tokens", "8", "--logging.progress", "false", "--log-completions", "false"]

# Runs the CLI with checkpoint-3's optimizer write stalled, so the parent can kill it mid-write.
STALLED_CLI = """
import sys, time, torch
real_save = torch.save
def stalled(obj, f, *a, **k):
    if ".tmp-checkpoint-3" in str(f) and str(f).endswith("optimizer.pt"):
        time.sleep(600)
    return real_save(obj, f, *a, **k)
torch.save = stalled
from vlm_grpo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def _wait_for(predicate, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"training exited early ({proc.returncode}): {proc.stdout.read()[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("timed out waiting for the training process")


def test_sigkill_mid_checkpoint_then_resume_equals_straight_run(tmp_path):
    straight = tmp_path / "straight"
    trained(GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--max-steps", "4", "--output-dir", str(straight)])))

    run = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-c", STALLED_CLI, "train", *RUN, "--max-steps", "4", "--save-every", "1", "--output-dir", str(run)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    _wait_for(lambda: any(run.glob(".tmp-checkpoint-3-*/model.safetensors")), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)

    partial = list(run.glob(".tmp-checkpoint-3-*"))
    assert partial and not (partial[0] / "optimizer.pt").exists()  # really killed mid-write
    assert [step for step, _ in ckpt.complete_checkpoints(run)] == [1, 2]
    assert ckpt.latest_checkpoint(run).name == "checkpoint-2"

    trained(GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--max-steps", "4", "--output-dir", str(run), "--resume"])))
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "vlm_grpo.cli", "train", *RUN, "--max-steps", "500", "--output-dir", str(tmp_path)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    metrics = tmp_path / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-2000:]  # stopped, not finished: a scheduler can tell
    step, path = ckpt.complete_checkpoints(tmp_path)[-1]
    assert f"vlm-grpo train: stopped at step {step} by SIGTERM; checkpoint-{step} saved in {tmp_path}; --resume continues" in out
    assert "done:" not in out and "Traceback" not in out
    assert 2 <= step < 500 and (path / "optimizer.pt").is_file()
    history = trained(GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--max-steps", str(step + 1), "--output-dir", str(tmp_path), "--resume"])))
    assert [m["step"] for m in history] == [step + 1]


def test_unusable_output_directory_fails_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(SettingError, match="'logging.output_dir': .*a-file is a file, not a folder"):
        GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--output-dir", str(blocker / "run")]))


def test_full_disk_fails_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda _p: type("Usage", (), {"free": 1024})())
    with pytest.raises(OSError, match=r"a checkpoint needs about [0-9.]+ KB but only 1\.0 KB are free; free some space"):
        GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--output-dir", str(tmp_path)]))


def test_a_crash_inside_save_leaves_no_checkpoint_to_resume_from(tmp_path, monkeypatch):
    trainer = GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--max-steps", "2", "--output-dir", str(tmp_path)]))
    trainer.train_step(0)

    def broken(*_a, **_k):
        raise OSError("disk went away")

    monkeypatch.setattr(ckpt.torch, "save", broken)
    with pytest.raises(OSError, match="disk went away"):
        trainer.checkpoints.save(1)
    assert ckpt.latest_checkpoint(tmp_path) is None
    assert list(tmp_path.glob(".tmp-checkpoint-1-*"))
