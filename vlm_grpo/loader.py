"""The one loader: a `--model` value -> a ready adapter, for every command and both trainers.

It parses the model spec (adapters/model_spec.py), builds a twin or preset or loads a checkpoint, puts the
model on its device by one rule, and decides once whether generation may use the KV cache (the cache policy
and, for `auto`, the probe in compat/), handing that decision to the adapter.
"""

from __future__ import annotations

import torch

from vlm_grpo.adapters.remote_code import check_remote_code
from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.adapters.model_spec import parse_model_spec
from vlm_grpo.adapters.model_dirs import auto_classes, read_model_type
from vlm_grpo.adapters.generic.groups import with_overrides
from vlm_grpo.adapters.registry import adapter_class, all_presets, class_for_model_type
from vlm_grpo.compat.tested_window import warn_outside_window
from vlm_grpo.compat.cache_policy import resolve_use_cache
from vlm_grpo.compat.cache_probe import STEPS


def default_device(device: str | torch.device | None = None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def load_model(
    spec: str,
    *,
    seed: int = 0,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device | None = None,
    attn_implementation: str | None = None,
    load_in_4bit: bool = False,
    trust_remote_code: bool = False,
    allow_pickle_weights: bool = False,
    cache_policy: str = "auto",
    decide_cache: bool = True,
    probe_steps: int = STEPS,
    module_groups: dict[str, list[str]] | None = None,
) -> VLMAdapter:
    """`spec` (see model_spec.py) on `device` (default: cuda if available, else cpu).

    Twins are built in float32 (`seed` draws their weights), presets in bfloat16 unless `dtype` names another;
    checkpoints load in `dtype` ("auto": as saved). `decide_cache=False` leaves the cache decision open (the
    cache probe command decides it itself); `probe_steps`: decode steps the cache probe compares (a run's
    max_new_tokens when smaller than the default 16); `module_groups`: regexes replacing module groups (group ->
    patterns), checked like the adapter's own: every parameter in exactly one group.
    """
    parsed = parse_model_spec(spec)
    device = default_device(device)
    warn_outside_window()  # once per package and process; the cache probe below still decides
    if parsed.kind == "tiny":
        adapter = adapter_class(parsed.name).tiny(seed=seed)
    elif parsed.kind == "preset":
        preset_dtype = torch.bfloat16 if dtype == "auto" else _torch_dtype(dtype)
        adapter = all_presets()[parsed.name].preset(parsed.name, seed=seed, dtype=preset_dtype)
    else:
        check_remote_code(parsed.name, trust_remote_code)  # refused without the flag, announced with it: no prompt
        cls = adapter_class(parsed.family) if parsed.family else class_for_model_type(
            read_model_type(parsed.name), where=parsed.name, auto_classes=auto_classes(parsed.name))
        adapter = cls.load(
            parsed.name, dtype=dtype, device_map=_device_map(device, load_in_4bit),
            attn_implementation=attn_implementation, load_in_4bit=load_in_4bit, trust_remote_code=trust_remote_code,
            allow_pickle_weights=allow_pickle_weights,
        )
    if load_in_4bit and parsed.kind in ("tiny", "preset"):  # built in memory: quantized as a checkpoint is, by loading
        adapter = _reloaded_in_4bit(adapter, device)
    adapter.module_layout = with_overrides(adapter.module_layout, module_groups)
    adapter.check_module_groups()  # a parameter in no group (or two) stops here, before any training
    if not load_in_4bit:  # a 4-bit model is placed by its device map and cannot be moved
        adapter.model.to(device)
    if decide_cache:
        apply_cache_policy(adapter, cache_policy, probe_steps)
    return adapter


def _device_map(device: torch.device, load_in_4bit: bool) -> str | None:
    """Where from_pretrained places the weights: a 4-bit model is placed while it loads (it cannot be moved after)."""
    if device.type == "cpu":
        return "cpu" if load_in_4bit else None
    return str(device)


def _reloaded_in_4bit(adapter: VLMAdapter, device: torch.device) -> VLMAdapter:
    """A twin or preset, saved and loaded back with 4-bit weights (a quantized model is only made by loading)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vlm-grpo-4bit-") as tmp:
        adapter.save(tmp)
        quantized = type(adapter).load(tmp, dtype=next(adapter.model.parameters()).dtype, load_in_4bit=True,
                                       device_map=_device_map(device, True))
    quantized.source = adapter.source or quantized.source
    quantized.model.name_or_path = adapter.model.name_or_path  # not the temporary directory
    quantized.model.config._name_or_path = adapter.model.config._name_or_path
    return quantized


def apply_cache_policy(adapter: VLMAdapter, policy: str = "auto", probe_steps: int = STEPS) -> bool:
    """Decide (once) whether `adapter` generates with the KV cache, and hand the decision to it."""
    adapter.use_cache = resolve_use_cache(adapter, policy, steps=max(2, probe_steps))
    return adapter.use_cache


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return value
