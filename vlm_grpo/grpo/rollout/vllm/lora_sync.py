"""LoRA and vLLM: send only the adapter (vLLM applies it per request) where vLLM can run it, else merged weights.

`rollout.vllm_lora_sync`: `auto` sends the adapter alone when the family's vLLM model supports LoRA and the adapter
is one vLLM takes (plain LoRA on the language model's linear layers, no module trained whole beside it, no expert
tensors, no DoRA), else the merged weights, and says which and why at start; `adapter` refuses a run that cannot;
`merged` always merges (TRL's way). With the adapter alone, the engine's base weights are pushed once (the policy's
base as the trainer holds it: a 4-bit base dequantized), then each sync writes the adapter as a peft checkpoint
(adapter_config.json + adapter_model.safetensors) that a new LoRA request of vLLM loads; the previous one is removed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # vlm-grpo vllm-serve's flags read MAX_RANKS: the command line starts without torch
    import torch

MODES = ("auto", "adapter", "merged")
MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's max_lora_rank takes


@dataclass
class LoraPlan:
    """How the policy reaches vLLM: the adapter alone (`adapter_only`), or merged weights; why, for the log."""

    adapter_only: bool
    reason: str
    rank: int = 0
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def max_lora_rank(self) -> int:
        return next(r for r in MAX_RANKS if r >= self.rank)

    def describe(self) -> str:
        if self.adapter_only:
            return f"vllm: LoRA adapter synced alone (rank {self.rank}): {self.reason}"
        return f"vllm: merged weights synced: {self.reason}"


def peft_config(model) -> Any | None:
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    return configs[getattr(model, "active_adapter", "default")]


def _why_not(adapter, config, vllm_supports_lora: bool, unsupported: str | None) -> str | None:
    """Why vLLM cannot take this adapter on its own (None: it can)."""
    if not vllm_supports_lora:
        return unsupported or f"vLLM's model for {adapter.family} does not support LoRA"
    if config.modules_to_save:
        return "optim.trainable_patterns train whole modules beside the adapter, which vLLM's LoRA does not take"
    if getattr(config, "target_parameters", None):
        return "the adapter has expert tensors (target_parameters), which vLLM's LoRA does not take"
    if getattr(config, "use_dora", False):
        return "DoRA adapters are not supported by vLLM"
    if config.r > MAX_RANKS[-1]:
        return f"rank {config.r} is above vLLM's largest max_lora_rank ({MAX_RANKS[-1]})"
    targets = sorted(config.target_modules) if not isinstance(config.target_modules, str) else [config.target_modules]
    outside = [t for t in targets if adapter.module_group_of(f"{t}.weight") != "language"]
    if outside:
        return f"LoRA on modules outside the language model ({outside[0]}{', ...' if len(outside) > 1 else ''}), " \
               "which vLLM's LoRA does not cover"
    return None


def plan_lora(adapter, mode: str, vllm_supports_lora: bool, unsupported: str | None = None,
              max_rank: int = MAX_RANKS[-1]) -> LoraPlan:
    """Adapter alone or merged, for this run's model and `rollout.vllm_lora_sync` (refusing `adapter` it cannot).
    `unsupported`: why the engine takes no LoRA, when it does not; `max_rank`: the largest rank it takes."""
    if mode not in MODES:
        raise ValueError(f"rollout.vllm_lora_sync {mode!r}: one of {', '.join(MODES)}")
    config = peft_config(adapter.model)
    if config is None:
        return LoraPlan(False, "no LoRA (full weights)")
    if mode == "merged":
        return LoraPlan(False, "rollout.vllm_lora_sync merged")
    why = _why_not(adapter, config, vllm_supports_lora, unsupported)
    if why is None and config.r > max_rank:
        why = f"rank {config.r} is above the engine's max_lora_rank ({max_rank})"
    if why is not None:
        if mode == "adapter":
            raise ValueError(f"rollout.vllm_lora_sync adapter: {why}; use auto or merged")
        return LoraPlan(False, why)
    settings = json.loads(json.dumps(config.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
    return LoraPlan(True, "the family's vLLM model supports LoRA and the adapter is plain LoRA on the language model",
                    rank=int(config.r), config=settings)


def write_adapter(directory: str | Path, config: dict[str, Any], tensors: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """A peft adapter checkpoint vLLM's LoRA request loads: adapter_config.json and adapter_model.safetensors."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to("cpu").contiguous() for name, t in tensors}
    if not state:
        raise ValueError("an adapter push with no LoRA tensor")
    save_file(state, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return directory


class AdapterVersions:
    """The adapters an engine holds: one LoRA request per sync (a new id, so vLLM loads it afresh), the previous one
    removed from the engine and from disk once the new one is in place."""

    def __init__(self, root: str | Path, remove_lora=None, request_class=None):
        """`remove_lora(id)`: the engine's; `request_class`: vLLM's LoRARequest (its default)."""
        self.root = Path(root)
        self.remove_lora = remove_lora
        self.request_class = request_class
        self.current: Any = None  # the LoRARequest rollouts use
        self.version = 0

    def add(self, config: dict[str, Any], tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None):
        if self.request_class is None:
            from vllm.lora.request import LoRARequest

            self.request_class = LoRARequest
        version = self.version + 1 if version is None else int(version)
        if version <= self.version:
            raise ValueError(f"adapter version {version} is not newer than the engine's {self.version}")
        path = write_adapter(self.root / f"adapter-{version}", config, tensors)
        previous = self.current
        self.current = self.request_class(f"policy-{version}", version, str(path))
        self.version = version
        self._drop(previous)
        return self.current

    def clear(self) -> None:
        """No adapter held, versions from 1 again (the base weights under the adapters were replaced)."""
        self._drop(self.current)
        self.current, self.version = None, 0

    def _drop(self, request) -> None:
        if request is None:
            return
        if self.remove_lora is not None:
            self.remove_lora(request.lora_int_id)
        import shutil

        shutil.rmtree(request.lora_path, ignore_errors=True)

    def request(self, version: int | None):
        """The LoRA request for `version` (None: none asked); only the latest is held."""
        if version is None:
            return None
        if self.current is None or int(version) != self.version:
            raise ValueError(f"adapter version {version} is not the engine's (it holds {self.version or 'none'}): "
                             "push the adapter first")
        return self.current
