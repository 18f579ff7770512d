"""train() runs once per trainer: TRL's Trainer would start a second call at step 0 and overwrite its checkpoints and
final model; here the second call is refused with what to do instead, and nothing the first wrote changes. A new
trainer's train(resume_from_checkpoint=PATH) continues from that checkpoint, its settings left as they were given."""

from __future__ import annotations

import pytest

from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.settings.sources import load_config


def settings(out, max_steps: int = 1):
    return load_config(overrides=["--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}",
                                  "--max-new-tokens", "2", "--batch-size", "1", "--num-generations", "2",
                                  "--max-steps", str(max_steps), "--logging.progress", "false",
                                  "--guard.audit_at_start", "false", "--log-completions", "false",
                                  "--output-dir", str(out)])


def test_a_second_train_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    trainer = GRPOTrainer.from_settings(settings(tmp_path))
    assert trainer.train().global_step == 1
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RuntimeError, match=r"train\(\) already ran on this trainer \(to step 1 of max_steps 1, in .*"
                                           r"a second call would start again at step 0 and overwrite its checkpoints"):
        trainer.train()
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_train_resumes_from_the_checkpoint_it_is_given(tmp_path):
    GRPOTrainer.from_settings(settings(tmp_path / "first")).train()
    cfg = settings(tmp_path / "next", max_steps=2)
    trainer = GRPOTrainer.from_settings(cfg)
    assert trainer.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-1")).global_step == 2
    assert [m["step"] for m in trainer.history] == [2]  # step 1 came from the checkpoint
    assert (cfg.resume, cfg.resume_from) == (False, None)
