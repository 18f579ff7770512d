"""Construction every family shares: an adapter from a model and its processor, from a checkpoint (safe by default),
from the family's twin (`tiny`, `preset`: sizes and `build` in adapters/twins/), and saved back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import torch


class Construction:
    """Mixed into VLMAdapter: how an adapter is made and saved."""

    def __init__(self, model: torch.nn.Module, processor: Any, source: str = "", use_cache: bool | None = None):
        self.model = model
        self.processor = processor
        self.source = source
        # Whether generation may use the KV cache; the loader decides it from the cache policy and the probe
        # (vlm_grpo.loader). Undecided (None) generates as transformers does by default, with the cache.
        self.use_cache = use_cache

    @classmethod
    def tiny(cls, seed: int = 0) -> Self:
        return cls.build(cls.tiny_architecture, seed=seed, dtype=torch.float32)

    @classmethod
    def preset(cls, name: str, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Self:
        if name not in cls.presets:
            raise ValueError(f"unknown {cls.family} preset {name!r}; known: {sorted(cls.presets)}")
        adapter = cls.build(cls.presets[name], seed=seed, dtype=dtype)
        adapter.source = f"preset:{name}"
        return adapter

    @classmethod
    def load(cls, path: str, *, dtype: torch.dtype | str = "auto", device_map: str | None = None,
             attn_implementation: str | None = None, load_in_4bit: bool = False, trust_remote_code: bool = False,
             allow_pickle_weights: bool = False) -> Self:
        """A checkpoint from a local directory or a hub id. Safe by default: no code shipped with it runs, and only
        safetensors weights load (unpickling .bin files can run code) unless `allow_pickle_weights`."""
        kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
        if not allow_pickle_weights:
            kwargs["use_safetensors"] = True
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        if load_in_4bit:
            from vlm_grpo.adapters.quantization import four_bit_loading

            kwargs.update(four_bit_loading(device_map))
        elif device_map:
            kwargs["device_map"] = device_map
        model = cls.checkpoint_class().from_pretrained(path, **kwargs)
        if load_in_4bit:
            from vlm_grpo.adapters.quantization import keep_differentiable_layout

            keep_differentiable_layout(model)
        return cls(model.eval(), cls.load_processor(path, trust_remote_code), source=str(path))

    @classmethod
    def checkpoint_class(cls) -> type:
        """The class whose from_pretrained reads a checkpoint of this family (default: model_class)."""
        return cls.model_class

    @classmethod
    def load_processor(cls, path: str, trust_remote_code: bool = False):
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
        processor.tokenizer.padding_side = "left"  # generation appends on the right: keep prompts adjacent to it
        return processor

    def save(self, out_dir: str | Path) -> None:
        self.model.save_pretrained(out_dir)
        self.processor.save_pretrained(out_dir)
