"""`vlm-grpo` command line: one sub-command per job, each a thin layer over the library."""

from __future__ import annotations

import argparse
import contextlib
import sys

from vlm_grpo.commands import add_settings_command


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="tiny:FAMILY | preset:NAME | FAMILY:PATH_OR_HUB_ID | PATH (family read from config.model_type)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (checkpoints only)")
    p.add_argument("--attn-implementation", default=None, help="eager | sdpa | flash_attention_2")
    p.add_argument("--load-in-4bit", action="store_true", help="bitsandbytes 4-bit (needs a CUDA GPU)")
    p.add_argument("--trust-remote-code", action="store_true", help="run code shipped with a checkpoint (off by default)")
    p.add_argument("--cache-policy", default="auto", choices=["auto", "cache", "no-cache"])
    p.add_argument("--seed", type=int, default=0, help="seed of tiny twins and presets")


def _load(args, decide_cache: bool = True):
    from vlm_grpo.loader import load_model

    return load_model(
        args.model,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        attn_implementation=args.attn_implementation,
        load_in_4bit=args.load_in_4bit,
        trust_remote_code=args.trust_remote_code,
        cache_policy=args.cache_policy,
        decide_cache=decide_cache,
    )


def cmd_check_cache(args) -> int:
    from vlm_grpo.compat.cache_policy import resolve_use_cache
    from vlm_grpo.compat.cache_probe import probe_cache
    from vlm_grpo.compat.simulated_quirk import image_features_dropped_after_prefill

    adapter = _load(args, decide_cache=False)
    simulate = image_features_dropped_after_prefill(adapter) if args.simulate_quirk else contextlib.nullcontext()
    with simulate:
        report = probe_cache(adapter, steps=args.steps)
        use_cache = resolve_use_cache(adapter, args.cache_policy, report=report)
    print(report.table())
    chosen = "KV cache" if use_cache else "no cache"
    print(f"policy {args.cache_policy}: generation uses {chosen}")
    if report.blind:
        print("FAIL: the probe is blind (swapping the image did not change the logits)", file=sys.stderr)
        return 2
    if not report.path_ok(use_cache):
        print(f"FAIL: the path the policy uses ({chosen}) disagrees with the teacher-forced forward", file=sys.stderr)
        return 1
    return 0


def cmd_generate(args) -> int:
    from PIL import Image

    from vlm_grpo.compat.probe_image import probe_images

    adapter = _load(args)
    image = Image.open(args.image) if args.image else probe_images()[0]
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": args.prompt}]}]
    batch = adapter.encode_prompts([conversation], [[image]]).to(next(adapter.model.parameters()).device)
    out = adapter.generate(batch, max_new_tokens=args.max_new_tokens)
    completion = out.sequences[0, batch.input_ids.shape[1] :]
    print(adapter.tokenizer.decode(completion, skip_special_tokens=True))
    return 0


def cmd_compose(args) -> int:
    from vlm_grpo.adapters.compose import compose

    out = compose(args.vision, args.llm, args.out, seed=args.seed)
    print(f"composed hybrid written to {out}; load it with --model hybrid:{out}")
    return 0


def cmd_train(args, extra: list[str]) -> int:
    from vlm_grpo.grpo.config import load_recipe_config
    from vlm_grpo.grpo.trainer import GRPOTrainer

    # recipe defaults (and a shipped checkpoint's GRPO settings) sit under the file and the command line
    cfg = load_recipe_config(args.config, extra)
    trainer = GRPOTrainer(cfg)
    history = trainer.train()
    if history and trainer.is_main:
        last = history[-1]
        print(f"done: {len(history)} steps, last reward {last['reward']:.3f}; run directory {cfg.logging.output_dir}")
    return 0


def cmd_families(args) -> int:
    from vlm_grpo.adapters.families_table import families_table

    print(families_table())
    return 0


def cmd_demo(args) -> int:
    """The offline main job until training lands: cache probe + a generation on every tiny twin."""
    from vlm_grpo.adapters.registry import families

    failures = 0
    for family in sorted(families()):
        print(f"\n=== tiny:{family} ===")
        ns = argparse.Namespace(
            model=f"tiny:{family}", device="cpu", dtype="auto", attn_implementation=None, load_in_4bit=False,
            trust_remote_code=False, cache_policy="auto", seed=0, steps=4, simulate_quirk=False,
            prompt="How many red triangles are in the image?", image=None, max_new_tokens=12,
        )
        failures += cmd_check_cache(ns) != 0
        print("sample completion (random weights):", end=" ")
        cmd_generate(ns)
    return 1 if failures else 0


# Commands that live in their own modules: each exposes `add_parser(subparsers)`, which sets
# `func` (and `takes_extra=True` if it accepts free --key value settings).
COMMAND_MODULES: tuple[str, ...] = (
    "vlm_grpo.commands.sft",
    "vlm_grpo.commands.eval",
    "vlm_grpo.inspect.plot_command",
    "vlm_grpo.inspect.attention_command",
    "vlm_grpo.inspect.completions",
    "vlm_grpo.commands.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlm-grpo", description="GRPO for vision-language models")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check-cache", help="probe whether KV-cached generation agrees with a full forward")
    _add_model_args(p)
    p.add_argument("--steps", type=int, default=4, help="decode steps compared (>= 2)")
    p.add_argument("--simulate-quirk", action="store_true", help="drop image features after prefill (self-test)")
    p.set_defaults(func=cmd_check_cache)

    p = sub.add_parser("generate", help="answer one image + prompt")
    _add_model_args(p)
    p.add_argument("--image", default=None, help="image file (default: a built-in test picture)")
    p.add_argument("--prompt", default="Describe the image.")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("compose", help="join a vision encoder and a causal LM into one hybrid checkpoint")
    p.add_argument("--vision", required=True, help="Qwen2.5-VL, SigLIP or CLIP checkpoint (path or hub id)")
    p.add_argument("--llm", required=True, help="causal LM checkpoint (path or hub id)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the re-initialised projector")
    p.set_defaults(func=cmd_compose)

    add_settings_command(
        sub, "train", cmd_train,
        help="GRPO training",
        description="GRPO training. Any setting can be given as --key value (e.g. --model tiny:smolvlm "
        "--recipe shapes --max-steps 3 --output-dir runs/x --loss.beta 0.04 --vision-lr 1e-6 --resume).",
    )

    p = sub.add_parser("families", help="supported families, model types, module groups and presets")
    p.set_defaults(func=cmd_families)

    p = sub.add_parser("demo", help="offline demo on every tiny twin: cache probe and a generation")
    p.set_defaults(func=cmd_demo)

    import importlib

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args, extra) if getattr(args, "takes_extra", False) else args.func(args)
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        print(f"vlm-grpo {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
