"""`vlm-grpo` command line: the list of sub-commands; each lives in its own module under commands/."""

from __future__ import annotations

import argparse
import os
import sys

from vlm_grpo.commands import (
    attention,
    audit_rewards,
    bench,
    check,
    check_cache,
    completions,
    compose,
    convert_gguf,
    demo,
    eval,
    families,
    generate,
    plot,
    sft,
    train,
    verify,
)

COMMANDS = (
    train, sft, eval, check, check_cache, audit_rewards, plot, attention, completions, generate, compose, convert_gguf,
    families, demo, bench, verify,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlm-grpo", description="GRPO for vision-language models")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args, extra) if getattr(args, "takes_extra", False) else args.func(args)
    except (ValueError, RuntimeError, OSError) as err:
        if os.environ.get("VLM_GRPO_TRACEBACK"):  # the one-line message hides where it came from: show it all
            raise
        print(f"vlm-grpo {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
