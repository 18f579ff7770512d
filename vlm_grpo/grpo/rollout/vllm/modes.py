"""Which vLLM engine a run rolls out with: colocate (colocate.py, in this process) or server (client.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from vlm_grpo.grpo.rollout.vllm.engine import VLLMEngine


def open_engine(adapter, cfg, device: torch.device, work_dir: str | Path | None = None,
                root: torch.nn.Module | None = None, announce: bool = True) -> VLLMEngine:
    """The engine the settings name, holding the policy's weights (`root`: the trainer's prepared model, whose shard
    units a push gathers). Every process of a launched run calls it at the same time; `announce`: this process
    prints what the push sends (LoRA alone or merged)."""
    if cfg.rollout.vllm_mode == "server":
        from vlm_grpo.grpo.rollout.vllm.client import ServerEngine

        engine: VLLMEngine = ServerEngine(adapter, cfg, root=root, announce=announce)
        engine.push()  # the server may hold other weights of the same model (another seed): the policy's now
    else:
        from vlm_grpo.grpo.rollout.vllm.colocate import ColocateEngine

        engine = ColocateEngine(adapter, cfg, device, work_dir, root=root, announce=announce)
    return engine
