"""Which vLLM engine a run rolls out with: colocate (vllm_engine.py, in this process) or server (vllm_server.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from vlm_grpo.grpo.rollout.vllm_engine import ColocateEngine, VLLMEngine
from vlm_grpo.grpo.rollout.vllm_server import ServerEngine


def open_engine(adapter, cfg, device: torch.device, work_dir: str | Path | None = None) -> VLLMEngine:
    """The engine the settings name; its weights are the policy's from the first rollout on."""
    if cfg.rollout.vllm_mode == "server":
        engine: VLLMEngine = ServerEngine(adapter, cfg)
        engine.push()  # the server may hold other weights of the same model (another seed): the policy's now
    else:
        engine = ColocateEngine(adapter, cfg, device, work_dir)
    return engine
