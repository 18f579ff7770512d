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

import time
from typing import Iterable

import torch

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.grpo.rollout.generation import Rollout
from vlm_grpo.grpo.rollout.turns import ToolRollout
from vlm_grpo.grpo.rollout.vllm.requests import VLLMTurns, requests, sampling_options, to_rollout
from vlm_grpo.grpo.rollout.vllm.lora_sync import MAX_RANKS, plan_lora
from vlm_grpo.grpo.rollout.vllm.weights import PolicyWeights, TensorSpec

PROTOCOL = 2  # the trainer <-> server wire format (server.py, client.py, wire.py)


class VLLMEngine:
    """What the trainer asks of either mode: `rollout` (sample) and `after_update` (push weights when due)."""

    def __init__(self, adapter, cfg, root: torch.nn.Module | None = None, lora_supported: bool = False,
                 lora_unsupported: str | None = None, max_lora_rank: int = MAX_RANKS[-1]):
        """`root`: the trainer's prepared model (its shard units, when sharded); `lora_supported`: whether the
        engine can apply a LoRA adapter per request, up to `max_lora_rank` (`lora_unsupported`: why not);
        lora_sync.py decides what a push sends."""
        self.adapter, self.cfg = adapter, cfg
        self.weights = PolicyWeights(adapter.model, root)
        self.lora = plan_lora(adapter, cfg.rollout.vllm_lora_sync, lora_supported, lora_unsupported, max_lora_rank)
        self.updates_since_push = 0
        self.pushes = 0
        self.version = 0  # the policy version the engine holds: pushes made so far
        self.push_seconds: list[float] = []  # each push's wall time (gathering, sending, loading)

    def rollout(self, samples, prompts: PromptBatch, gen, num_generations: int, device, session=None,
                chat_format=None, *, max_iterations: int | None = None, encoder: torch.nn.Module | None = None
                ) -> Rollout:
        """G completions per prompt; with a tool `session` (and its `chat_format`), multi-turn: the tool loop of
        rollout/turns.py with its turns sampled here (`VLLMTurns`), the tool images encoded by the trainer as
        ToolRollout.sample encodes them (`encoder`: the model whose features keep their gradient)."""
        seed = int(torch.randint(0, 2**31 - 1, (1,)))  # the step's seed (train_step seeded torch)
        if session is not None:
            return ToolRollout.sample(self.adapter, samples, gen, num_generations, device, session, chat_format,
                                      prompts, encoder=encoder, max_iterations=max_iterations,
                                      engine=VLLMTurns(self, session, seed))
        results = self.generate(requests(self.adapter, samples), sampling_options(self.adapter, gen, num_generations,
                                                                                   seed))
        return to_rollout(self.adapter, prompts, samples, results, num_generations, device)

    def after_update(self) -> None:
        self.updates_since_push += 1
        if self.updates_since_push >= self.cfg.rollout.vllm_sync_steps:
            self.push()

    def push(self) -> None:
        """The policy's weights as they are now, into the engine: the merged weights, or (LoRA synced alone) the base
        once and then the adapter. Every process calls it at the same time (a sharded policy gathers unit by unit)."""
        started = time.perf_counter()
        if self.lora.adapter_only:
            if self.version == 0:  # the engine's base: the policy's, as the trainer holds it
                self.load_weights(self.weights.stream("base"), self.weights.specs("base"))
            self.load_adapter(self.version + 1, self.weights.stream("adapter"), self.weights.specs("adapter"))
        else:
            self.load_weights(self.weights.stream("merged"), self.weights.specs("merged"))
        self.version += 1
        self.updates_since_push = 0
        self.pushes += 1
        self.push_seconds.append(time.perf_counter() - started)

    def generate(self, reqs: list[dict], options: dict) -> list[dict]:
        raise NotImplementedError

    def load_weights(self, items: Iterable[tuple[str, torch.Tensor]], specs: list[TensorSpec]) -> None:
        """Full weights (`specs` lists them in order, before any is gathered) into the engine, in place."""
        raise NotImplementedError

    def load_adapter(self, version: int, items: Iterable[tuple[str, torch.Tensor]], specs: list[TensorSpec]) -> None:
        """The LoRA adapter's matrices as the engine's adapter `version`, which later rollouts use."""
        raise NotImplementedError

    def close(self) -> None:
        pass
