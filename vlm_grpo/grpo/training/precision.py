"""bf16 where it pays: the policy's weights stored in bfloat16, with float32 master weights in the optimizer.

Autocast over float32 weights (accelerate's mixed precision) recasts every weight at every forward, the 152k-row LM
head among them; on a CPU that costs more than the bf16 products save (benchmarks/RESULTS.md). So with
`mixed_precision bf16` the trained model itself is cast to bfloat16 once (its reference copy with it): the
forwards, the backward and the rollout's decode multiply bf16 weights, and the rollout reads the very weights the
last update wrote. The update runs in float32 on master copies: each trainable weight's bf16 gradient is
upcast onto its master, the optimizer (clipping, AdamW's moments) steps the masters, and the masters are rounded
back into the bf16 weights. An lr-1e-5 step is far below bf16's resolution (2^-8 relative), so without masters
most updates would round to nothing.

Kept on accelerate's autocast: a 4-bit base (its compute dtype is bitsandbytes') and FSDP (its own mixed precision
policy shards the weights it casts).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

MASTER_FILE = "master_weights.safetensors"  # in every checkpoint of a run whose weights are stored in bf16


@functools.cache
def cpu_bf16_flags() -> tuple[str, ...]:
    """The CPU's native bfloat16 instructions (AMX-BF16, AVX512-BF16) as Linux reports them; () elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return tuple(f for f in ("amx_bf16", "avx512_bf16") if f in flags)


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bf16 matrix products run natively on `device` (CUDA with bf16 support, or a CPU with AMX-BF16 or
    AVX512-BF16): there bf16 is several times float32's speed; elsewhere torch emulates it, slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(cpu_bf16_flags())


def stores_bf16(cfg) -> bool:
    """Whether the run keeps its weights in bf16 (with float32 masters) rather than autocasting float32 ones."""
    return cfg.mixed_precision == "bf16" and not cfg.lora.load_in_4bit and cfg.fsdp == "no"


def accelerator_precision(cfg) -> str:
    """accelerate's mixed_precision for the run: none where the weights themselves are bf16."""
    return "no" if stores_bf16(cfg) else cfg.mixed_precision


def to_bf16(model: torch.nn.Module) -> None:
    """The model's floating-point weights in bfloat16, in place (each Parameter kept, so tied weights stay tied).
    Buffers stay as they are, as `from_pretrained(dtype=bfloat16)` leaves them: a rotary table's inverse
    frequencies rounded to bf16 would turn far positions by the wrong angle."""
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != torch.bfloat16:
            param.data = param.data.to(torch.bfloat16)


class MasterWeights:
    """Float32 masters of a bf16 model's trainable weights: the optimizer steps these, the model multiplies those.

    In the run's checkpoints as MASTER_FILE (a resumed run continues from the masters, not from their rounding)."""

    def __init__(self, model: torch.nn.Module):
        self.names: list[str] = []
        self.weights: list[torch.nn.Parameter] = []
        self.masters: list[torch.nn.Parameter] = []
        self._of: dict[int, torch.nn.Parameter] = {}
        for name, param in model.named_parameters():
            if param.requires_grad and param.dtype == torch.bfloat16:
                master = torch.nn.Parameter(param.detach().float(), requires_grad=True)
                self.names.append(name)
                self.weights.append(param)
                self.masters.append(master)
                self._of[id(param)] = master
        self._grads: list[torch.Tensor | None] = [None] * len(self.masters)  # the masters' gradient buffers

    def __len__(self) -> int:
        return len(self.masters)

    def param_groups(self, groups: list[dict]) -> list[dict]:
        """The optimizer's groups with each bf16 weight replaced by its master (others as they are)."""
        return [{**g, "params": [self._of.get(id(p), p) for p in g["params"]]} for g in groups]

    def gradients_in(self) -> None:
        """Each weight's gradient (summed over micro-batches, reduced across processes) onto its master, in fp32,
        through one buffer per master kept across updates: a fresh fp32 copy each update would allocate (and fault
        in) the size of all trainable weights again, 2.2 GB at 3B widths."""
        for k, (weight, master) in enumerate(zip(self.weights, self.masters)):
            if weight.grad is None:
                master.grad = None
                continue
            if self._grads[k] is None:
                self._grads[k] = torch.empty_like(master, memory_format=torch.preserve_format)
            master.grad = self._grads[k].copy_(weight.grad)
            weight.grad = None

    def clear_weight_gradients(self) -> None:
        for weight in self.weights:
            weight.grad = None

    @torch.no_grad()
    def weights_out(self) -> None:
        """The masters, rounded to bf16, into the weights the forwards and the rollout use."""
        for weight, master in zip(self.weights, self.masters):
            weight.copy_(master)

    @torch.no_grad()
    def from_weights(self) -> None:
        """Masters equal to the weights as they are (a checkpoint without masters, weights loaded from elsewhere)."""
        for weight, master in zip(self.weights, self.masters):
            master.copy_(weight)

    # ---------------------------------------------------------------- in the run's checkpoints (grpo/parts Kept)
    def state_dict(self) -> dict[str, Any]:
        return {}

    def save_files(self, directory: Path) -> None:
        from safetensors.torch import save_file

        save_file({name: m.detach().contiguous() for name, m in zip(self.names, self.masters)}, str(directory / MASTER_FILE))

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        """The checkpoint's masters (their bf16 rounding is the weights it holds); a checkpoint written without them
        (a float32 run resumed in bf16) starts the masters from its weights."""
        path = Path(checkpoint) / MASTER_FILE
        if not path.exists():
            log.warning("%s has no %s: the float32 masters start from its weights", checkpoint, MASTER_FILE)
            self.from_weights()
            return
        from safetensors.torch import load_file

        saved = load_file(str(path))
        missing = [n for n in self.names if n not in saved]
        if missing:
            raise ValueError(f"{path}: no master weight for {len(missing)} trainable weights, e.g. {missing[0]!r}")
        with torch.no_grad():
            for name, master in zip(self.names, self.masters):
                if saved[name].shape != master.shape:
                    raise ValueError(f"{path}: master {name!r} has shape {tuple(saved[name].shape)}, the weight "
                                     f"{tuple(master.shape)}")
                master.copy_(saved[name])
        self.weights_out()
