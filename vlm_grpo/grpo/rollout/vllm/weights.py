"""The policy's weights as vLLM takes them, read one shard unit at a time.

vLLM loads checkpoint tensors by name. `PolicyWeights` lists the policy's tensors under those names and yields them
in model order:
- full weights: every parameter and persistent buffer; a LoRA layer's base weight with its adapters' deltas added
  (peft's own `get_delta_weight`, computed per tensor: the policy's weights are never merged and unmerged in place,
  which in bf16 would leave them changed), a `modules_to_save` copy under its original name;
- adapter only: the LoRA matrices under the names peft saves them with (lora_sync.py writes them as an adapter).

Under FSDP every process calls the stream at the same time: each shard unit (a transformer block, or the root's
embeddings, head and projector) is gathered, its tensors are yielded as copies, and it is freed again before the
next unit, so no process ever holds the whole unsharded model beside its shards (vLLM keeps its own copy, which it
loads layer by layer as the tensors come). A model that is not sharded is read in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from vlm_grpo.grpo.rollout.vllm.runtime import architecture_of, unwrapped

PARTS = ("merged", "base", "adapter")
LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a push: its checkpoint name, shape and dtype (what a receiver allocates before it arrives)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def as_wire(self) -> list:
        return [self.name, str(self.dtype).removeprefix("torch."), list(self.shape)]

    @classmethod
    def from_wire(cls, item) -> "TensorSpec":
        name, dtype, shape = item
        kind = getattr(torch, str(dtype), None)
        if not isinstance(kind, torch.dtype):
            raise ValueError(f"tensor {str(name)[:80]!r}: unknown dtype {str(dtype)[:40]!r}")
        return cls(str(name), tuple(int(d) for d in shape), kind)


@dataclass(frozen=True)
class _Entry:
    """Where one pushed tensor lives: `module.attr` (read when its unit is gathered) and how it is formed."""

    name: str
    module: torch.nn.Module
    attr: str
    kind: str  # "plain"; "merged": a LoRA-wrapped tensor plus its deltas; "lora": an adapter matrix
    lora_layers: tuple = ()  # the LoRA layers whose deltas add to this tensor (peft nests one per expert tensor)


def _is_unit(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _lora_layer(module: torch.nn.Module) -> bool:
    return hasattr(module, "lora_A") and hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")


def checkpoint_name(qualified: str) -> str:
    """A peft-wrapped model's parameter name as the plain model's checkpoint names it: no `base_model.model.`
    prefix, no `base_layer` (nested wrappers have several), a `modules_to_save` copy under its module's name."""
    parts = qualified.removeprefix("base_model.model.").split(".")
    if "modules_to_save" in parts:  # the trained copy of a module peft keeps beside the original
        k = parts.index("modules_to_save")
        parts = parts[:k] + parts[k + 2:]
    return ".".join(p for p in parts if p != "base_layer")


def _wraps(layer: torch.nn.Module, attr: str) -> bool:
    """Whether a LoRA layer adds its delta to the tensor `attr` of the module it wraps: its target parameter (an
    expert tensor) or a layer's `weight`."""
    return getattr(layer, "parameter_name", None) == attr if hasattr(layer, "parameter_name") else attr == "weight"


class PolicyWeights:
    """The tensors a push sends, in model order, grouped by the shard unit that holds them.

    `model`: the adapter's model (peft-wrapped or not); `root`: the trainer's prepared model when it is sharded
    (fsdp.ShardedModel, the unit owning what no block owns), else None."""

    def __init__(self, model: torch.nn.Module, root: torch.nn.Module | None = None):
        self.model = model
        self.root = root if root is not None and _is_unit(root) else None
        self.groups: list[tuple[torch.nn.Module | None, list[_Entry]]] = []
        self._layout()

    # ---------------------------------------------------------------- what is where
    def _layout(self) -> None:
        units: dict[str, torch.nn.Module | None] = {"": self.root}  # module path -> the unit that holds its tensors
        order: list[torch.nn.Module | None] = []
        by_unit: dict[int, list[_Entry]] = {}
        lora_layers: dict[str, torch.nn.Module] = {}
        for path, module in self.model.named_modules():
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            units[path] = module if _is_unit(module) else units.get(parent, self.root)
            if _lora_layer(module):
                lora_layers[path] = module
            unit = units[path]
            skip = set(getattr(module, "_non_persistent_buffers_set", ()))
            tensors = [n for n, _ in module.named_parameters(recurse=False)]
            tensors += [n for n, b in module.named_buffers(recurse=False) if n not in skip and b is not None]
            for attr in tensors:
                qualified = f"{path}.{attr}" if path else attr
                entry = self._entry(qualified, path, module, attr, lora_layers)
                if entry is None:
                    continue
                if id(unit) not in by_unit:
                    by_unit[id(unit)] = []
                    order.append(unit)
                by_unit[id(unit)].append(entry)
        self.groups = [(unit, by_unit[id(unit)]) for unit in order]

    def _entry(self, qualified: str, path: str, module, attr: str, lora_layers) -> _Entry | None:
        parts = path.split(".")
        if "original_module" in parts:  # peft's untouched original of a module trained whole: the copy goes
            return None
        lora_part = next((p for p in parts if p in LORA_PARTS), None) or (attr if attr in LORA_PARTS else None)
        if lora_part is not None:
            return _Entry(self._adapter_name(qualified), module, attr, "lora")
        # the LoRA layers this tensor sits under, through one or more `base_layer` steps
        wrappers, above = [], path
        while above.endswith(".base_layer"):
            above = above.removesuffix(".base_layer")
            if above in lora_layers and _wraps(lora_layers[above], attr):
                wrappers.append(lora_layers[above])
        if wrappers:
            return _Entry(checkpoint_name(qualified), module, attr, "merged", tuple(wrappers))
        return _Entry(checkpoint_name(qualified), module, attr, "plain")

    def _adapter_name(self, qualified: str) -> str:
        """peft's saved name of an adapter matrix: the adapter's own name taken out (`...lora_A.default.weight` ->
        `...lora_A.weight`), as `get_peft_model_state_dict` writes it."""
        adapter = getattr(self.model, "active_adapter", "default")
        return qualified.replace(f".{adapter}.", ".").replace(f".{adapter}", "")

    @property
    def has_lora(self) -> bool:
        return any(e.kind == "lora" for _, entries in self.groups for e in entries)

    def entries(self, part: str = "merged") -> list[_Entry]:
        return [e for _, entries in self.groups for e in entries if _in_part(e, part)]

    def specs(self, part: str = "merged") -> list[TensorSpec]:
        """What a push of `part` sends, without gathering anything (a sharded tensor's shape is its full shape)."""
        return [TensorSpec(e.name, tuple(_full_shape(e)), _dtype(e)) for e in self.entries(part)]

    # ---------------------------------------------------------------- the tensors
    def stream(self, part: str = "merged") -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of `part` in model order: `merged` (the weights with LoRA deltas added), `base` (LoRA's
        base weights alone) or `adapter` (the LoRA matrices). Every process of a sharded model must consume the
        whole stream at the same time (gathering a unit is a collective); a yielded tensor is the caller's."""
        if part not in PARTS:
            raise ValueError(f"weights part {part!r}: one of {', '.join(PARTS)}")
        sharded = self.root is not None
        for unit, entries in self.groups:
            chosen = [e for e in entries if _in_part(e, part)]
            if not chosen:
                continue
            with _gathered(unit if sharded else None):
                for entry in chosen:
                    tensor = (_value(entry) if part == "merged" else _base(entry)).detach()
                    # a gathered tensor is freed when its unit is resharded: hand out a copy
                    yield entry.name, tensor.clone() if sharded else tensor


def _in_part(entry: _Entry, part: str) -> bool:
    return entry.kind == "lora" if part == "adapter" else entry.kind != "lora"


@contextlib.contextmanager
def _gathered(unit) -> Iterator[None]:
    if unit is None:
        yield
        return
    unit.unshard()
    try:
        yield
    finally:
        unit.reshard()


def _current(entry: _Entry) -> torch.Tensor:
    return getattr(entry.module, entry.attr)


def _quantized(entry: _Entry):
    """The 4-bit state of a weight bitsandbytes packed (None: a plain tensor)."""
    return getattr(_current(entry), "quant_state", None)


def _full_shape(entry: _Entry) -> torch.Size:
    state = _quantized(entry)  # a 4-bit weight: its shape before packing
    return torch.Size(state.shape) if state is not None else _current(entry).shape


def _dtype(entry: _Entry) -> torch.dtype:
    state = _quantized(entry)  # a 4-bit weight is sent dequantized, in its compute dtype
    return state.dtype if state is not None else _current(entry).dtype


def _base(entry: _Entry) -> torch.Tensor:
    """A tensor as the policy computes with it: a 4-bit weight dequantized (peft's helper)."""
    if _quantized(entry) is not None:
        from peft.utils.integrations import dequantize_module_weight

        return dequantize_module_weight(entry.module).to(_dtype(entry))
    return _current(entry)


def _value(entry: _Entry) -> torch.Tensor:
    """The tensor with its LoRA deltas added (each active adapter's, by peft's own `get_delta_weight`)."""
    if entry.kind != "merged":
        return _base(entry)
    merged = _base(entry).detach().clone()
    for layer in entry.lora_layers:
        for name in layer.active_adapters:
            if name not in layer.lora_A and name not in getattr(layer, "lora_embedding_A", {}):
                continue
            if getattr(layer, "use_dora", {}).get(name, False):
                raise ValueError(f"{entry.name}: a DoRA adapter cannot be merged per tensor here; use plain LoRA")
            merged += layer.get_delta_weight(name).to(merged.dtype)
    return merged


def pushed_weights(model: torch.nn.Module, root: torch.nn.Module | None = None) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a full push as a CPU copy (tests, small models: a push itself streams)."""
    return [(name, t.to("cpu", copy=True)) for name, t in PolicyWeights(model, root).stream()]


def signature(architecture: str, shapes: Iterable[tuple[str, tuple[int, ...]]]) -> str:
    """What trainer and server must agree on: the architecture and every weight's name and shape."""
    text = json.dumps([architecture, sorted((n, list(s)) for n, s in shapes)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_signature(model: torch.nn.Module, root: torch.nn.Module | None = None) -> str:
    return signature(architecture_of(model), ((s.name, s.shape) for s in PolicyWeights(model, root).specs()))


def export_model(adapter, directory: str | Path) -> Path:
    """The policy as a checkpoint vLLM loads (config, float32 safetensors, processor, chat template)."""
    import copy

    directory = Path(directory)
    model = unwrapped(adapter.model)
    if hasattr(adapter.model, "merge_and_unload"):  # LoRA: a merged copy (peft's own merge), the policy untouched
        model = copy.deepcopy(adapter.model).merge_and_unload()
    model = copy.deepcopy(model).to("cpu", torch.float32) if next(model.parameters()).dtype != torch.float32 else model
    model.save_pretrained(directory)
    adapter.processor.save_pretrained(directory)
    return directory


def export_config(adapter, directory: str | Path) -> Path:
    """What vLLM needs to build the policy's model without its weights (they are pushed once it has started): the
    config (naming its architecture, as a saved checkpoint does), the generation config and the processor with its
    chat template. Every process may write its own; no weight is gathered or written."""
    import copy

    directory = Path(directory)
    model = unwrapped(adapter.model)
    config = copy.deepcopy(model.config)
    config.architectures = [architecture_of(model)]
    config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    adapter.processor.save_pretrained(directory)
    return directory
