"""The run's policy as its settings name it: `model.init_from` (a checkpoint to start from) wins over `model.name`."""

from __future__ import annotations

import contextlib

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


def apply_prompt_settings(adapter, cfg: TrainConfig) -> None:
    """TRL's chat_template_kwargs: extra apply_chat_template arguments of every prompt the adapter encodes."""
    if cfg.data.chat_template_kwargs:  # read by the adapter's encode_prompts (absent: none)
        adapter.chat_template_kwargs = dict(cfg.data.chat_template_kwargs)


def generation_fields(gen) -> dict:
    """TRL's repetition_penalty, min_p, cache_implementation and generation_kwargs, and compile_decode, as
    GenerationConfig fields (only those set: none at the defaults)."""
    fields = dict(gen.generation_kwargs)
    if gen.compile_decode == "false":
        fields["disable_compile"] = True
    elif gen.compile_decode == "true":
        fields["compile_config"] = cpu_compile_config()
    if gen.repetition_penalty != 1.0:
        fields["repetition_penalty"] = gen.repetition_penalty
    if gen.min_p is not None:
        fields["min_p"] = gen.min_p
    if gen.cache_implementation is not None:
        fields["cache_implementation"] = gen.cache_implementation
    return fields


def cpu_compile_config():
    """transformers' CompileConfig with its switch to compile generate() on any device (by default only on a GPU)."""
    from transformers.generation.configuration_utils import CompileConfig

    from vlm_grpo.grpo.setting_fields import SettingError

    config = CompileConfig(fullgraph=False, dynamic=False, mode="default")  # no CUDA graphs off a GPU
    if not hasattr(config, "_compile_all_devices"):  # the switch moved: say so rather than run uncompiled
        raise SettingError("compile_decode", "this transformers has no switch to compile generate() off a GPU "
                           "(CompileConfig._compile_all_devices): use auto")
    config._compile_all_devices = True
    return config


def check_generation_fields(model, gen) -> None:
    config = model.generation_config
    for key in generation_fields(gen):
        if not hasattr(config, key):
            raise ValueError(f"generation.generation_kwargs: {key!r} is not a transformers GenerationConfig field")


@contextlib.contextmanager
def sampling_with(model, gen):
    """The rollout's generate() calls with `generation_fields` on the model's generation config, which generate() and
    the sampler's warpers read; restored after, so evaluation and the saved model keep the model's own."""
    fields, config = generation_fields(gen), model.generation_config
    before = {key: getattr(config, key) for key in fields}
    for key, value in fields.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            setattr(config, key, value)
