"""--gradient-checkpointing: the same update as without, the blocks really recompute in backward, and rollouts
(which need the KV cache) are untouched."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer

RUN = ["--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "5", "--logging.progress", "false",
       "--log-completions", "false", "--max-steps", "1", "--learning-rate", "1e-2", "--batch-size", "2",
       "--share-prompt", "false"]  # the same forward both ways (checkpointing turns the shared prompt off)


def _step(family, tmp_path, checkpointed: bool):
    words = [*RUN, "--model", f"tiny:{family}", "--output-dir", str(tmp_path / str(checkpointed)),
             "--gradient-checkpointing", str(checkpointed).lower()]
    trainer = GRPOTrainer.from_settings(load_config(overrides=words))
    calls = [0]
    for block in trainer.adapter.model.modules():
        if isinstance(block, GradientCheckpointingLayer) and getattr(block, "_gradient_checkpointing_func", None):
            real = block._gradient_checkpointing_func

            def counted(*args, real=real, **kwargs):  # the segments transformers hands to torch's checkpoint
                calls[0] += 1
                return real(*args, **kwargs)

            block._gradient_checkpointing_func = counted
    trainer.train_step(0)
    return {n: p.detach().clone() for n, p in trainer.adapter.model.named_parameters()}, calls[0], trainer


@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm", "gemma3"])
def test_checkpointing_gives_the_same_update_and_recomputes(family, tmp_path):
    plain, plain_calls, _ = _step(family, tmp_path, False)
    ckpt, ckpt_calls, trainer = _step(family, tmp_path, True)
    assert plain_calls == 0 and ckpt_calls > 0  # the policy forward's blocks were checkpointed, and only then
    for name, value in plain.items():
        assert torch.allclose(value, ckpt[name], atol=1e-6, rtol=1e-5), name
    assert not any(m.training for m in trainer.adapter.model.modules())  # eval mode again after the step
