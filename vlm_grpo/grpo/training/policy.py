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
