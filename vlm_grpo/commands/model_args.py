"""The model flags every model-loading command shares (check-cache, generate, attention, demo), and the
one call that turns them into an adapter: `vlm_grpo.loader.load_model`."""

from __future__ import annotations

import argparse

from vlm_grpo.compat.cache_policy import POLICIES


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="tiny:FAMILY|TYPE | preset:NAME | pretrained:NAME | FAMILY:PATH_OR_HUB_ID | TYPE:PATH | PATH (family read "
        "from config.model_type; a model type without a family file goes to the generic adapter)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (checkpoints and presets)")
    p.add_argument("--attn-implementation", default=None, help="eager | sdpa | flash_attention_2")
    p.add_argument("--load-in-4bit", action="store_true", help="bitsandbytes 4-bit (needs a CUDA GPU)")
    p.add_argument("--trust-remote-code", action="store_true", help="run code shipped with a checkpoint (off by default)")
    p.add_argument("--allow-pickle-weights", action="store_true", help="also load pickled .bin weights (off by default)")
    p.add_argument("--cache-policy", default="auto", choices=list(POLICIES))
    p.add_argument("--seed", type=int, default=0, help="seed of tiny twins and presets")


def load_from_args(args: argparse.Namespace, decide_cache: bool = True):
    from vlm_grpo.loader import load_model

    return load_model(
        args.model,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        attn_implementation=args.attn_implementation,
        load_in_4bit=args.load_in_4bit,
        trust_remote_code=args.trust_remote_code,
        allow_pickle_weights=args.allow_pickle_weights,
        cache_policy=args.cache_policy,
        decide_cache=decide_cache,
    )


def model_namespace(model: str, **overrides) -> argparse.Namespace:
    """The namespace `add_model_args` would give for `--model model` with defaults (for commands run in-process)."""
    p = argparse.ArgumentParser()
    add_model_args(p)
    args = p.parse_args(["--model", model])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args
