"""Rollouts sampled by vLLM (`rollout.engine: vllm`), as TRL's `use_vllm`: in this process (colocate) or in a
`vlm-grpo vllm-serve` server (server.py, client.py). This is what both modes share (colocate.py, client.py).

The trainer still encodes every prompt (its log-prob forwards need the PromptBatch); vLLM gets the same prompt
text (the adapter's chat template) and images, runs the model's own processor, and its prompt token ids are checked
against the trainer's each step, so image tokens line up. vLLM returns each sampled token's log-prob (processed: at
the sampling temperature); the loss uses the trainer's recomputed log-probs, weighed by the truncated ratio
(algorithm/sampling_correction.py). The policy's weights (LoRA merged, as TRL does) are pushed to vLLM after every
`vllm_sync_steps` optimizer steps, and its prefix and encoder caches are reset after each push.
"""

from __future__ import annotations

import torch

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.grpo.rollout.generation import Rollout
from vlm_grpo.grpo.rollout.vllm.requests import requests, sampling_options, to_rollout
from vlm_grpo.grpo.rollout.vllm.weights import pushed_weights

PROTOCOL = 1  # the trainer <-> server wire format (server.py, client.py)


class VLLMEngine:
    """What the trainer asks of either mode: `rollout` (sample) and `after_update` (push weights when due)."""

    def __init__(self, adapter, cfg):
        self.adapter, self.cfg = adapter, cfg
        self.updates_since_push = 0
        self.pushes = 0

    def rollout(self, samples, prompts: PromptBatch, gen, num_generations: int, device) -> Rollout:
        seed = int(torch.randint(0, 2**31 - 1, (1,)))  # the step's seed (train_step seeded torch)
        results = self.generate(requests(self.adapter, samples), sampling_options(self.adapter, gen, num_generations,
                                                                                   seed))
        return to_rollout(self.adapter, prompts, samples, results, num_generations, device)

    def after_update(self) -> None:
        self.updates_since_push += 1
        if self.updates_since_push >= self.cfg.rollout.vllm_sync_steps:
            self.push()

    def push(self) -> None:
        self.load_weights(pushed_weights(self.adapter.model))
        self.updates_since_push = 0
        self.pushes += 1

    def generate(self, reqs: list[dict], options: dict) -> list[dict]:
        raise NotImplementedError

    def load_weights(self, items: list[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass
