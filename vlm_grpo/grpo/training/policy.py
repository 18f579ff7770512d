"""The run's policy as its settings name it: `model.init_from` (a checkpoint to start from) wins over `model.name`."""

from __future__ import annotations

import torch

from vlm_grpo.compat.cache_probe import probe_steps
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.loader import load_model


def load_policy(cfg: TrainConfig, device: torch.device | None = None, decide_cache: bool = True):
    """The adapter of `model.init_from` (a checkpoint to start from) or else `model.name`, on `device`."""
    return load_model(
        cfg.model.init_from or cfg.model.name,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        device=device or cfg.model.device,
        attn_implementation=cfg.model.attn_implementation,
        load_in_4bit=cfg.lora.load_in_4bit,
        trust_remote_code=cfg.model.trust_remote_code,
        allow_pickle_weights=cfg.model.allow_pickle_weights,
        cache_policy=cfg.model.cache_policy,
        probe_steps=probe_steps(cfg.generation.max_new_tokens),
        decide_cache=decide_cache,
        module_groups=cfg.model.module_groups or None,
    )


def apply_prompt_and_generation_settings(adapter, cfg: TrainConfig) -> None:
    """The settings that shape prompts and sampling beyond the sampler's own (TRL's chat_template_kwargs,
    repetition_penalty, min_p, cache_implementation, generation_kwargs): the chat template's extra arguments on the
    adapter, the rest on the model's generation config, which generate() and the sampler's warpers read. Nothing is
    touched when they are at their defaults."""
    if cfg.data.chat_template_kwargs:  # read by the adapter's encode_prompts (absent: none)
        adapter.chat_template_kwargs = dict(cfg.data.chat_template_kwargs)
    gen = cfg.generation
    fields = {**gen.generation_kwargs}
    if gen.repetition_penalty != 1.0:
        fields["repetition_penalty"] = gen.repetition_penalty
    if gen.min_p is not None:
        fields["min_p"] = gen.min_p
    if gen.cache_implementation is not None:
        fields["cache_implementation"] = gen.cache_implementation
    if fields:
        config = adapter.model.generation_config
        for key, value in fields.items():
            if not hasattr(config, key):
                raise ValueError(f"generation.generation_kwargs: {key!r} is not a transformers GenerationConfig field")
            setattr(config, key, value)
