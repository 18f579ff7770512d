"""SFT's stage: the supervised warm-up, its loss on each row's `completion` only (grpo/sft.py), one update a step."""

from __future__ import annotations

from typing import Any

import torch

from vlm_grpo.grpo.data.order import step_seed
from vlm_grpo.grpo.loop.stage import RunInputs, Stage
from vlm_grpo.grpo.parts.supervised_update import SupervisedUpdate


class SFTStage(Stage):
    stage = "sft"
    dropout = True
    needs_rewards = False

    def _assemble_step(self, inputs: RunInputs) -> list:
        self.supervised_update = SupervisedUpdate(self.ctx, self.policy, self.evaluation)
        return []

    def completion_budget(self) -> int:
        return self.cfg.sft.max_reference_tokens

    def train_step(self, step: int) -> dict[str, Any]:
        torch.manual_seed(step_seed(self.cfg.seed, step, self.ctx.accelerator.process_index))  # dropout: same on resume
        return self.supervised_update.run(self.data.batch(step).samples, step)
