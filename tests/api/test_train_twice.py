"""train() runs once per trainer: TRL's Trainer would start a second call at step 0 and overwrite its checkpoints and
final model; here the second call is refused with what to do instead, and nothing the first wrote changes."""

from __future__ import annotations

import pytest

from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.settings.sources import load_config


def test_a_second_train_is_refused_and_leaves_the_run_as_it_was(tmp_path):
    cfg = load_config(overrides=["--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}",
                                 "--max-new-tokens", "2", "--batch-size", "1", "--num-generations", "2",
                                 "--max-steps", "1", "--logging.progress", "false", "--guard.audit_at_start", "false",
                                 "--log-completions", "false", "--output-dir", str(tmp_path)])
    trainer = GRPOTrainer.from_settings(cfg)
    assert trainer.train().global_step == 1
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RuntimeError, match=r"train\(\) already ran on this trainer \(to step 1 of max_steps 1, in .*"
                                           r"a second call would start again at step 0 and overwrite its checkpoints"):
        trainer.train()
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1
