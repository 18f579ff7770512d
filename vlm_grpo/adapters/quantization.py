"""4-bit loading (QLoRA's base): bitsandbytes NF4 with double quantization, wherever bitsandbytes runs.

bitsandbytes (0.45 and later) runs 4-bit layers on CUDA and on the CPU, backward included, so a LoRA trains on a 4-bit
base on either. Compute runs in bf16 on a GPU and in float32 on the CPU (a CPU has no fast bf16 matrix product,
and float32 keeps the 4-bit model's outputs as close to the full one as NF4 allows).
"""

from __future__ import annotations

import importlib.util

import torch


def four_bit_config(device: torch.device | str | None = None):
    """The quantization config for a base loaded on `device` (default: cuda if available, else cpu)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError("4-bit loading (QLoRA) needs bitsandbytes: pip install bitsandbytes (or 'vlm-grpo[quant]')")
    from transformers import BitsAndBytesConfig

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
    )


def four_bit_loading(device_map: str | None) -> dict:
    """from_pretrained's placement and quantization of a 4-bit base: placed while it loads (it cannot be moved
    after), on `device_map` or else the GPU when there is one."""
    device_map = device_map or ("auto" if torch.cuda.is_available() else "cpu")
    return {"device_map": device_map, "quantization_config": four_bit_config("cpu" if device_map == "cpu" else "cuda")}


def is_loaded_in_4bit(model: torch.nn.Module) -> bool:
    """Whether `model` (or the model inside a wrapper) was loaded with 4-bit weights."""
    if getattr(model, "is_loaded_in_4bit", False):
        return True
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    if isinstance(qc, dict):
        return bool(qc.get("load_in_4bit"))
    return bool(getattr(qc, "load_in_4bit", False))


def keep_differentiable_layout(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel. On CPUs with AVX512-BF16 a 4-bit
    layer called in eval mode without gradient rewrites its weight, in place, into a layout whose product carries no
    gradient to the layer's input, and never switches back: a rollout would then cut the gradient of every later
    LoRA update off below each quantized layer. (The repacking also fails on inputs narrower than a quantization
    block, as a tiny twin's vision tower has.) Returns the layers set."""
    layers = [m for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)
