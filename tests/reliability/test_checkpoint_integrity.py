"""Damaged checkpoints: resume names the bad file, falls back to the newest good checkpoint, and ends exactly
where an uninterrupted run ends; `vlm-grpo verify` finds the same damage."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from vlm_grpo.cli import main
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

RUN = ["--model", "tiny:qwen2_5_vl", "--learning-rate", "1e-3", "--data.recipe_options", "{image_size: 56}",
       "--max-new-tokens", "6", "--logging.progress", "false", "--log-completions", "false", "--max-steps", "3",
       "--save-every", "1", "--keep-checkpoints", "3"]


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_bytes(path):
    data = bytearray(path.read_bytes())
    for k in range(len(data) - 4096, len(data) - 3072):  # a KB inside the last tensor, size unchanged
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated weights": ("model.safetensors", truncate),
    "truncated optimizer": ("optimizer.pt", truncate),
    "truncated rng state": ("rng_state.pt", truncate),
    "truncated trainer state": ("trainer_state.json", truncate),
    "weights overwritten, same size": ("model.safetensors", flip_bytes),
    "missing scheduler": ("scheduler.pt", lambda p: p.unlink()),
}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run = tmp_path_factory.mktemp("straight")
    trained(GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--output-dir", str(run)])))
    return run


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_resume_passes_over_a_damaged_checkpoint(straight, tmp_path, kind, capsys):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "final")
    name, damage = DAMAGE[kind]
    damage(run / "checkpoint-3" / name)

    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "checkpoint-2: OK" in out and f"checkpoint-3: DAMAGED: {name}" in out

    trained(GRPOTrainer.from_settings(load_config(overrides=[*RUN, "--output-dir", str(run), "--resume"])))
    out = capsys.readouterr().out
    assert f"checkpoint-3 is damaged, not resuming from it: {name}" in out and "resumed from" in out
    assert "checkpoint-2 (step 2)" in out
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["verify", str(run)]) == 0  # the re-run step rewrote checkpoint-3 whole


def test_no_good_checkpoint_stops_with_one_message(straight, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    for ckpt_dir in run.glob("checkpoint-*"):
        truncate(ckpt_dir / "model.safetensors")
    code = main(["train", *RUN, "--output-dir", str(run), "--resume"])
    assert code == 1  # failed (exit codes: 0 done, 1 failed, 2 refused setting, 130/143 stopped)


def test_a_manifest_update_hashes_only_what_changed_and_equals_a_full_one(tmp_path, monkeypatch):
    from vlm_grpo.grpo.checkpoint import manifest

    (tmp_path / "weights.bin").write_bytes(b"w" * 4096)
    (tmp_path / "README.md").write_text("a card")
    manifest.write_manifest(tmp_path)
    (tmp_path / "README.md").write_text("the final card")  # rewritten
    (tmp_path / "curves.png").write_bytes(b"png")  # new
    hashed = []
    digest = manifest.file_digest
    monkeypatch.setattr(manifest, "file_digest", lambda p: hashed.append(p.name) or digest(p))
    updated = manifest.write_manifest(tmp_path, changed=["README.md"]).read_text()
    assert sorted(hashed) == ["README.md", "curves.png"]  # the weights are not read again
    assert updated == manifest.write_manifest(tmp_path).read_text()
    assert manifest.verify(tmp_path) == []
