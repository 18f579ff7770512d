"""Colocate mode: vLLM in the trainer's process, built from the policy as exported at start."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from vlm_grpo.grpo.rollout.vllm.engine import VLLMEngine
from vlm_grpo.grpo.rollout.vllm.runtime import build_llm, check_runnable, import_vllm, llm_generate, llm_load_weights, max_model_len
from vlm_grpo.grpo.rollout.vllm.weights import export_model


class ColocateEngine(VLLMEngine):
    """vLLM in the trainer's process, built from the policy as exported at start."""

    def __init__(self, adapter, cfg, device: torch.device, work_dir: str | Path | None = None):
        super().__init__(adapter, cfg)
        vllm = import_vllm()
        from vllm import ModelRegistry

        check_runnable(adapter, device, ModelRegistry.get_supported_archs())
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-model-", dir=work_dir)
        export_model(adapter, self._tmp.name)
        r = cfg.rollout
        self.llm = build_llm(self._tmp.name, max_model_len=max_model_len(adapter, cfg), seed=cfg.seed,
                             gpu_memory_utilization=r.vllm_gpu_memory_utilization, kvcache_gb=r.vllm_cpu_kvcache_gb,
                             on_cpu=device.type == "cpu")
        self.version = vllm.__version__

    def generate(self, reqs, options):
        return llm_generate(self.llm, reqs, options)

    def load_weights(self, items):
        llm_load_weights(self.llm, items)

    def close(self) -> None:
        self.llm = None
        self._tmp.cleanup()

