"""A step's size checked before the first step: against the training set (how often a step repeats each row) and
against the device's memory (the least a rollout of B x G sequences must hold at once).

A step that cannot fit would otherwise fail deep inside the allocator (or make the machine swap for hours while a
signal waits for the step to end); one that draws each row hundreds of times is a typo. Both are refused in one line
naming data.batch_size (and data.num_generations), the numbers and what fits.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vlm_grpo.grpo.setting_fields import SettingError

MAX_REPEATS_PER_STEP = 16  # a step may draw each row of a small training set up to this many times
GIB = 1024 ** 3


def check_against_dataset(rows: int, batch_size: int, processes: int = 1) -> None:
    """Refuse a step that draws each training row more than MAX_REPEATS_PER_STEP times."""
    per_step = batch_size * processes
    if rows > 0 and per_step > MAX_REPEATS_PER_STEP * rows:
        most = MAX_REPEATS_PER_STEP * rows // processes
        raise SettingError("data.batch_size", f"{batch_size} prompts a step" + (f" x {processes} processes" if
                           processes > 1 else "") + f" from a training set of {rows} rows would draw each row about "
                           f"{per_step // rows} times in one step; at most {MAX_REPEATS_PER_STEP} times (data."
                           f"batch_size <= {most}): lower data.batch_size or give more rows")


def free_memory(device: torch.device) -> int | None:
    """Bytes free on `device` now (None: unknown)."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        if device.type == "cpu":  # MemAvailable counts the page cache the kernel would give back; free pages do not
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError, RuntimeError):
        return None
    return None


def _largest(config, name: str):
    """A config's value of `name`; on a config whose layers differ in it (per-layer head dims, which transformers
    refuses to read globally), the largest layer's: a lower bound stays a lower bound."""
    try:
        return getattr(config, name, None)
    except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError
        layers = getattr(config, "per_layer_config", None) or {}
        values = [getattr(layer, name, None) if not isinstance(layer, dict) else layer.get(name)
                  for layer in (layers.values() if isinstance(layers, dict) else layers)]
        values = [v for v in values if isinstance(v, int)]
        return max(values) if values else None


def rollout_bytes(config, dtype: torch.dtype, sequences: int, tokens: int) -> tuple[int, int]:
    """(KV cache, logits) bytes a rollout of `sequences` sequences `tokens` long needs at the least: each layer's
    keys and values of every token, and one decode step's float32 logits over the vocabulary."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(_largest(text, "num_hidden_layers") or 0)
    heads = int(_largest(text, "num_attention_heads") or 0)
    kv_heads = int(_largest(text, "num_key_value_heads") or heads)
    head_dim = int(_largest(text, "head_dim") or ((_largest(text, "hidden_size") or 0) // max(heads, 1)))
    vocab = int(_largest(text, "vocab_size") or 0)
    width = torch.empty((), dtype=dtype).element_size()
    kv = sequences * tokens * layers * 2 * kv_heads * head_dim * width
    return kv, sequences * vocab * 4


def check_against_memory(model, device: torch.device, batch_size: int, per_prompt: int, tokens: int,
                         free: int | None = None) -> None:
    """Refuse a step whose rollout's KV cache and logits alone exceed the device's free memory."""
    free = free_memory(device) if free is None else free
    if not free:
        return
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    sequences = batch_size * per_prompt
    kv, logits = rollout_bytes(model.config, dtype, sequences, tokens)
    if kv + logits <= free:
        return
    what = f"{batch_size} prompts x {per_prompt} completions = {sequences} sequences" if per_prompt > 1 else \
        f"{sequences} sequences"
    raise SettingError("data.batch_size" + (", data.num_generations" if per_prompt > 1 else ""),
                       f"a step holds {what} of at least {tokens} tokens at once: their KV cache and logits alone "
                       f"need {(kv + logits) / GIB:.1f} GiB, and {device} has {free / GIB:.1f} GiB free: lower "
                       "data.batch_size" + (" or data.num_generations" if per_prompt > 1 else "") +
                       " (gradient_accumulation_steps splits only the update, not the rollout)")
