"""One GRPO step under a given process layout, for test_fsdp.py's gradient-equality test.

    python layout_worker.py OUT [--fsdp full_shard]            (1 process: all 4 prompts)
    accelerate launch --num_processes 2 layout_worker.py OUT ...  (2 processes: 2 prompts each)

Every layout must see the same completions, so the rollout is replaced: each process samples the whole step's
4 prompts with one fixed seed (the real rollout, on the policy's gathered weights under FSDP) and keeps the rows of
its own prompts. The gradients (whole tensors, averaged over processes as the update sees them) and the weights
after the update are written to OUT by the main process.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import torch

from vlm_grpo.grpo.checkpoint import sharded as shards
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.parts import sampler as sampler_module
from vlm_grpo.grpo.parts import trained_policy as update_module  # where the update step is called
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.grpo.data.order import batch_indices
from vlm_grpo.grpo.distributed.fsdp import full_tensor, is_sharded

GLOBAL_BATCH = 4


def rows_of_prompts(ro, first: int, count: int):
    """The part of a rollout that belongs to prompts first .. first+count-1."""
    g = ro.num_generations
    prompts = list(range(first, first + count))
    rows = slice(first * g, (first + count) * g)
    return replace(
        ro,
        prompts=ro.prompts.select(prompts),
        completion_ids=ro.completion_ids[rows],
        completion_mask=ro.completion_mask[rows],
        completions=ro.completions[rows],
        prompt_texts=ro.prompt_texts[first : first + count],
        features=None if ro.features is None else ro.features.select(prompts),
    )


def main(out: str, *settings: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch
    per = GLOBAL_BATCH // world
    cfg = load_config(overrides=[
        "--model", "tiny:qwen2_5_vl", "--output-dir", f"{out}.run", "--overwrite-output-dir",
        "--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "8", "--logging.progress", "false",
        "--batch-size", str(per), "--beta", "0.04", "--learning-rate", "1e-3", "--max-grad-norm", "0", *settings,
    ])
    real_rollout = sampler_module.rollout
    trainer = GRPOTrainer.from_settings(cfg)
    rank = trainer.accelerator.process_index
    dataset = trainer.train_dataset
    everyone = [dataset[i] for i in batch_indices(len(dataset), GLOBAL_BATCH, 0, cfg.seed)]

    def same_rollout_everywhere(adapter, samples, gen, num_generations, device, **kwargs):
        kwargs.pop("prompts", None), kwargs.pop("features", None)  # this process's: the whole step's are made here
        torch.manual_seed(1234)
        whole = real_rollout(adapter, everyone, gen, num_generations, device, **kwargs)
        assert [s.prompt for s in samples] == [s.prompt for s in everyone[rank * per : (rank + 1) * per]]
        return rows_of_prompts(whole, rank * per, per)

    grads: dict[str, torch.Tensor] = {}
    real_update = update_module.update_step

    def recording_update(accelerator, optimizer, optim_cfg):
        for name, param in trainer.adapter.model.named_parameters():
            if param.grad is not None:
                grads[name] = full_tensor(param.grad).detach().clone()
        return real_update(accelerator, optimizer, optim_cfg)

    sampler_module.rollout = same_rollout_everywhere
    update_module.update_step = recording_update
    metrics = trainer.train_step(0)
    if is_sharded(trainer.policy.model):  # the prepared policy: FSDP's sharded root
        weights = shards.full_state_dict(trainer.adapter.model)
    else:
        weights = {k: v.detach().clone() for k, v in trainer.adapter.model.state_dict().items()}
    if trainer.is_main:
        torch.save({"grads": grads, "weights": weights, "kl": metrics["kl"], "world": world}, out)
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:])
