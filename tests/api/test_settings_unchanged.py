"""Building a trainer never writes into its settings: what the build derives (TRL's save_strategy "epoch", the
loss's completion limit) lives in the parts, and `trainer.cfg` stays the validated settings it was given."""

from __future__ import annotations

from tests.api.test_python_api import FAST, rows, says_colour
from vlm_grpo import GRPOConfig, GRPOTrainer


def test_a_save_each_epoch_lives_in_the_saves_not_in_the_settings(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "run"), save_strategy="epoch", **FAST)
    given = args.train_config.to_dict()
    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[says_colour], args=args, train_dataset=rows())
    try:
        assert trainer.steps_per_epoch != given["logging"]["save_every"]  # the case where a write-back would show
        assert trainer.run.saves.save_every == trainer.steps_per_epoch
        built = trainer.cfg.to_dict()  # the model and data sections hold what the constructor was given
        assert {k: built[k] for k in ("logging", "loss", "resume", "resume_from")} == {
            k: given[k] for k in ("logging", "loss", "resume", "resume_from")}
        assert trainer.policy_update.objective.cfg.max_completion_length == trainer.cfg.generation.max_new_tokens
    finally:
        trainer.ctx.release_lock()
