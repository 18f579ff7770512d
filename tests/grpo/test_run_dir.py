"""Run directories: an old run is never appended to, the resolved settings are saved as a valid --config file,
and a run can resume from any checkpoint it is pointed at."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from vlm_grpo.cli import main
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_config

RUN = ["--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4",
       "--logging.progress", "false", "--log-completions", "false", "--max-steps", "2", "--learning-rate", "1e-3"]


def test_an_old_run_is_refused_unless_resumed_or_replaced(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *RUN, "--output-dir", str(run)]) == 0
    (run / "notes.txt").write_text("mine")
    assert main(["train", *RUN, "--output-dir", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert len(read_jsonl(run / "metrics.jsonl")) == 2  # untouched
    assert main(["train", *RUN, "--max-steps", "1", "--output-dir", str(run), "--overwrite-output-dir"]) == 0
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]  # replaced, not appended
    assert (run / "notes.txt").read_text() == "mine" and not (run / "checkpoint-2").exists()


def test_the_default_scratch_directory_is_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["train", *RUN, "--max-steps", "1"]) == 0
    assert [r["step"] for r in read_jsonl(tmp_path / "runs" / "latest" / "metrics.jsonl")] == [1]


def test_config_yaml_round_trips(tmp_path):
    run = tmp_path / "run"
    words = [*RUN, "--output-dir", str(run), "--beta", "0.04", "--freeze", "vision", "--epsilon", "0.3",
             "--scale_rewards", "false", "--lora.r", "4"]
    assert main(["train", *words]) == 0
    saved = load_config(run / "config.yaml")
    assert saved == load_config(overrides=words)
    assert saved.loss.epsilon_high == 0.3 and saved.scale_rewards == "none" and saved.lora.r == 4
    again = tmp_path / "again"
    assert main(["train", "--config", str(run / "config.yaml"), "--output-dir", str(again)]) == 0
    assert load_config(again / "config.yaml") == load_config(run / "config.yaml", ["--output-dir", str(again)])


def test_resume_from_a_named_checkpoint(tmp_path):
    first = tmp_path / "first"
    assert main(["train", *RUN, "--output-dir", str(first), "--save-every", "1"]) == 0
    for flag in ("--resume-from", "--resume_from_checkpoint"):  # ours and TRL's name
        other = tmp_path / flag.strip("-")
        assert main(["train", *RUN, "--output-dir", str(other), flag, str(first / "checkpoint-1")]) == 0
        assert [r["step"] for r in read_jsonl(other / "metrics.jsonl")] == [2]
        a, b = load_file(first / "final" / "model.safetensors"), load_file(other / "final" / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert main(["train", *RUN, "--output-dir", str(tmp_path / "x"), "--resume-from", str(tmp_path / "nope")]) == 2
