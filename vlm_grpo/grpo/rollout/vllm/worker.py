"""What runs inside vLLM's engine workers: the weight loads a push makes, through vLLM's worker-extension hook.

vLLM mixes this class into its worker (`LLM(worker_extension_cls="vlm_grpo.grpo.rollout.vllm.worker.WeightLoader")`)
and the engine calls its methods on every worker with `collective_rpc("vlm_grpo_...", args=...)`, in the worker's
own process when vLLM runs workers apart from the engine. Each load goes through the worker's `reload_weights`,
which takes checkpoint-named tensors one at a time and repacks each layer once its tensors are all in (in place: the
engine keeps its memory, its compiled kernels and its KV cache). Arguments are plain data, so these calls work
whatever process layout vLLM chose; `vlm_grpo_load` alone takes a live iterator (an engine in this process).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from vlm_grpo.grpo.rollout.vllm.transport import BUCKET_BYTES, join_group
from vlm_grpo.grpo.rollout.vllm.weights import TensorSpec


class _Counted:
    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]):
        self.items, self.count = items, 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for item in self.items:
            self.count += 1
            yield item


class WeightLoader:
    """Methods vLLM adds to its worker; `self` is the worker (its `rank`, `device`, `reload_weights`)."""

    def vlm_grpo_load(self, items: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load (name, tensor) pairs in place, as they come (colocate, and a server reading an HTTP push)."""
        counted = _Counted(items)
        self.reload_weights(weights_iterator=iter(counted))
        return counted.count

    def vlm_grpo_join(self, host: str, port: int, world_size: int, token: str, backend: str, timeout_s: float) -> int:
        """Join the trainer's weight group (transport.py) as this worker's rank; returns it."""
        self.vlm_grpo_leave()
        device = getattr(self, "device", None)
        self._vlm_grpo_group = join_group(host, port, rank=int(self.rank), world_size=world_size, backend=backend,
                                          token=token, timeout_s=timeout_s,
                                          device=device if backend == "nccl" else None)
        return int(self.rank)

    def _vlm_grpo_received(self, specs: list) -> Iterator[tuple[str, torch.Tensor]]:
        group = getattr(self, "_vlm_grpo_group", None)
        if group is None:
            raise RuntimeError("no weight group: the trainer must join one first (/init_communicator/)")
        return group.receive([TensorSpec.from_wire(s) for s in specs], BUCKET_BYTES)

    def vlm_grpo_receive(self, specs: list) -> int:
        """Load the tensors the trainer broadcasts, in the order of `specs` ([name, dtype, shape] each)."""
        return self.vlm_grpo_load(self._vlm_grpo_received(specs))

    def vlm_grpo_receive_tensors(self, specs: list) -> dict[str, torch.Tensor]:
        """The tensors the trainer broadcasts, kept as CPU copies (a LoRA adapter: the engine loads it as a file)."""
        return {name: t.to("cpu", copy=True) for name, t in self._vlm_grpo_received(specs)}

    def vlm_grpo_leave(self) -> None:
        group = getattr(self, "_vlm_grpo_group", None)
        if group is not None:
            group.close()
        self._vlm_grpo_group = None
