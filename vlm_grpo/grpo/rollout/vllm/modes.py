"""Which vLLM engine a run rolls out with: colocate (colocate.py, in this process) or server (client.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from vlm_grpo.grpo.rollout.vllm.client import ServerEngine
from vlm_grpo.grpo.rollout.vllm.colocate import ColocateEngine
from vlm_grpo.grpo.rollout.vllm.engine import VLLMEngine


def open_engine(adapter, cfg, device: torch.device, work_dir: str | Path | None = None) -> VLLMEngine:
    """The engine the settings name; its weights are the policy's from the first rollout on."""
    if cfg.rollout.vllm_mode == "server":
        engine: VLLMEngine = ServerEngine(adapter, cfg)
        engine.push()  # the server may hold other weights of the same model (another seed): the policy's now
    else:
        engine = ColocateEngine(adapter, cfg, device, work_dir)
    return engine
