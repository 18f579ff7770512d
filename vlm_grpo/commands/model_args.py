"""The model flags every model-loading command shares (check-cache, generate, attention, demo), generated from the
model settings (`ModelConfig` and lora.load_in_4bit; grpo/settings/model.py, light to import), and the one call that turns them into an
adapter: `vlm_grpo.loader.load_model`."""

from __future__ import annotations

import argparse

from vlm_grpo.commands.settings import add_dataclass_args

MODEL_FIELDS = ("name", "device", "dtype", "attn_implementation", "cache_policy", "trust_remote_code",
                "allow_pickle_weights", "module_groups")


def add_model_args(p: argparse.ArgumentParser) -> None:
    from vlm_grpo.grpo.settings.model import LoraSettings, ModelConfig

    add_dataclass_args(p, ModelConfig, names={"name": "model"}, only=MODEL_FIELDS, required=("name",))
    add_dataclass_args(p, LoraSettings, only=("load_in_4bit",))
    p.add_argument("--seed", type=int, default=0, help="seed of tiny twins and presets (a run's `seed` setting)")


def load_from_args(args: argparse.Namespace, decide_cache: bool = True):
    from vlm_grpo.loader import load_model

    return load_model(
        args.name,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        attn_implementation=args.attn_implementation,
        load_in_4bit=args.load_in_4bit,
        trust_remote_code=args.trust_remote_code,
        allow_pickle_weights=args.allow_pickle_weights,
        cache_policy=args.cache_policy,
        decide_cache=decide_cache,
        module_groups=args.module_groups or None,
    )


def model_namespace(model: str, **overrides) -> argparse.Namespace:
    """The namespace `add_model_args` would give for `--model model` with defaults (for commands run in-process)."""
    p = argparse.ArgumentParser()
    add_model_args(p)
    args = p.parse_args(["--model", model])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args
