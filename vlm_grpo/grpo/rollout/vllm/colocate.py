"""Colocate mode: vLLM in the trainer's process. Under DDP or FSDP every process drives an engine of its own (vLLM
joins the launched group as TRL's colocate does) and samples its own prompts; with `vllm_tensor_parallel_size` k,
each k consecutive processes drive one engine together, its tensor-parallel ranks, and sample their prompts in one
call (gathered, generated alike on every rank, each rank taking back its own), every tool turn too (a rank
with no row left takes part with none).

The engine is built from the policy's config and processor alone, on placeholder weights, and the policy's weights
are pushed into it at once (weights.py streams them one shard unit at a time under FSDP): nothing is written to
disk, and no process holds the unsharded policy beside vLLM's copy.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from vlm_grpo.grpo.rollout.vllm.engine import VLLMEngine
from vlm_grpo.grpo.rollout.vllm.lora_sync import AdapterVersions
from vlm_grpo.grpo.rollout.vllm.runtime import (
    architecture_of, build_llm, check_runnable, import_vllm, llm_generate, llm_load_weights, max_model_len,
    supports_lora,
)
from vlm_grpo.grpo.rollout.vllm.weights import export_config


def launched_processes() -> int:
    """How many processes the run was launched with (1 without torch.distributed)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def tensor_parallel_group(size: int):
    """This process's group of `size` consecutive ranks (vLLM's tensor-parallel layout under external_launcher), or
    None for size 1. Every process must call it (making groups is collective)."""
    if size == 1:
        return None
    world = launched_processes()
    if world % size:
        raise ValueError(f"rollout.vllm_tensor_parallel_size {size}: the run's {world} processes do not split into "
                         f"engines of {size}: launch a multiple of {size}")
    # gloo whatever the run's backend: it carries Python objects (requests) and flags, on the CPU
    group, _ = torch.distributed.new_subgroups_by_enumeration([list(range(i, i + size)) for i in range(0, world, size)],
                                                              backend="gloo")
    return group


class ColocateEngine(VLLMEngine):
    def __init__(self, adapter, cfg, device: torch.device, work_dir: str | Path | None = None,
                 root: torch.nn.Module | None = None, announce: bool = True):
        vllm = import_vllm()
        from vllm import ModelRegistry

        check_runnable(adapter, device, ModelRegistry.get_supported_archs())
        super().__init__(adapter, cfg, root, lora_supported=supports_lora(architecture_of(adapter.model)))
        if announce:
            print(self.lora.describe(), flush=True)
        self._tmp = tempfile.TemporaryDirectory(prefix="vllm-model-", dir=work_dir)
        export_config(adapter, self._tmp.name)
        r = cfg.rollout
        self.tp_group = tensor_parallel_group(r.vllm_tensor_parallel_size)
        self.llm = build_llm(self._tmp.name, max_model_len=max_model_len(adapter, cfg), seed=cfg.seed,
                             gpu_memory_utilization=r.vllm_gpu_memory_utilization, kvcache_gb=r.vllm_cpu_kvcache_gb,
                             on_cpu=device.type == "cpu", weights_later=True,
                             max_lora_rank=self.lora.max_lora_rank if self.lora.adapter_only else 0,
                             distributed=launched_processes() > 1, tensor_parallel_size=r.vllm_tensor_parallel_size)
        if self.tp_group is not None and announce:
            from vllm.distributed import get_tensor_model_parallel_world_size

            print(f"vllm: one engine over {get_tensor_model_parallel_world_size()} processes (tensor parallel)",
                  flush=True)
        self.adapters = AdapterVersions(Path(self._tmp.name) / "adapters", remove_lora=self.llm.llm_engine.remove_lora)
        self.vllm_version = vllm.__version__
        self.push()  # the engine started on placeholders: the policy's weights from the first rollout on

    def generate(self, reqs, options):
        if self.tp_group is None:
            return llm_generate(self.llm, reqs, options, lora_request=self.adapters.current)
        # the engine's ranks must be asked the same, in the same order: every rank's requests, each with its options
        own = options if isinstance(options, list) else [options] * len(reqs)
        asked: list = [None] * torch.distributed.get_world_size(self.tp_group)
        torch.distributed.all_gather_object(asked, (reqs, own), group=self.tp_group)
        everyone = [r for rs, _ in asked for r in rs]
        if not everyone:  # a tool round in which no process has a row left: nothing to sample
            return []
        results = llm_generate(self.llm, everyone, [o for _, os in asked for o in os],
                               lora_request=self.adapters.current)
        start = sum(len(rs) for rs, _ in asked[:torch.distributed.get_rank(self.tp_group)])
        return results[start:start + len(reqs)]

    def load_weights(self, items, specs):
        llm_load_weights(self.llm, items)

    def load_adapter(self, version, items, specs):
        self.adapters.add(self.lora.config, items, version)

    def close(self) -> None:
        self.llm = None
        self._tmp.cleanup()
