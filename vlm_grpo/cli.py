"""`vlm-grpo` command line: the list of sub-commands; each lives in its own module under commands/.

Command modules import nothing heavy at the top (torch, transformers, the loop load when a command runs), so
`vlm-grpo --help` and `vlm-grpo --version` answer at once.

Exit codes, for schedulers: 0 done; 1 failed (one line naming what; `--debug` or `VLM_GRPO_TRACEBACK=1` for the
traceback, which a training run also appends to its errors.log); 2 refused before starting (a bad setting or command
line); 130 / 143 stopped by SIGINT / SIGTERM at any moment, imports included (a training run saves its last step
first and says so). A resource that ran out (a full disk, `ulimit -f` / `-n` / `-v`, memory) is a failure too, in one
line naming the limit (vlm_grpo/resource_limits.py); SIGXFSZ is ignored, so a write past `ulimit -f` fails with
EFBIG instead of killing the process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from vlm_grpo import resource_limits
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
    env,
    eval,
    experiment,
    families,
    generate,
    plot,
    report,
    sft,
    train,
    verify,
    vllm_serve,
)
from vlm_grpo.grpo.interrupts import StopSignal
from vlm_grpo.grpo.run import stop_signals
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.terminal import safe_streams

FAILED, REFUSED = 1, 2
COMMANDS = (
    train, sft, eval, experiment, check, check_cache, audit_rewards, plot, report, attention, completions, generate, compose,
    convert_gguf, families, demo, bench, verify, env, vllm_serve,
)


class Parser(argparse.ArgumentParser):
    """An epilog given as a function is written only when help is shown (the settings listing reads the loop's
    settings classes, which import torch)."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    from vlm_grpo.version import __version__

    parser = Parser(prog="vlm-grpo", description="GRPO for vision-language models")
    parser.add_argument("--version", action="version", version=f"vlm-grpo {__version__}")
    parser.add_argument("--debug", action="store_true", help="on failure, print the full traceback (a user function's "
                        "own) before the one-line error; may stand anywhere on the command line")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    stop_signals.install()  # first: a signal during the imports below stops with 130/143 like any other
    resource_limits.writes_past_the_file_size_limit_fail()
    try:
        with safe_streams():  # whatever a command prints from a run or from the user: no terminal control sequence
            code = _main(list(sys.argv[1:] if argv is None else argv))
    except StopSignal as stop:
        print(f"vlm-grpo: {stop}", file=sys.stderr)
        code = stop.exit_code
    except BaseException:  # noqa: BLE001 - after a signal, whatever broke on the way out (an import it cut short
        # leaves a half-made module behind) is the signal's doing: the signal decides the exit
        signum = stop_signals.received()
        if not signum:
            raise
        print(f"vlm-grpo: stopped by {stop_signals.signal_name(signum)}", file=sys.stderr)
        code = 128 + signum
    signum = stop_signals.received()
    if signum and code != 128 + signum:  # its StopSignal was swallowed somewhere: the signal still decides
        code = 128 + signum
    return code


def _main(argv: list[str]) -> int:
    debug = "--debug" in argv  # anywhere on the line: the settings commands read the rest as settings
    argv = [a for a in argv if a != "--debug"]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with stop_signals.signals_stop():  # SIGTERM stops like Ctrl-C: a StopSignal, not a silent kill
            code = args.func(args, extra) if getattr(args, "takes_extra", False) else args.func(args)
            stop_signals.raise_if_received()
            return code
    except StopSignal as stop:
        print(f"vlm-grpo {args.command}: {stop}", file=sys.stderr)
        return stop.exit_code
    except (ValueError, RuntimeError, OSError, MemoryError, ImportError) as err:
        ran_out = resource_limits.explain(err)  # a disk, a limit or memory that ran out: which, and its limit
        if ran_out is None and isinstance(err, (MemoryError, ImportError)):  # a missing package: its own traceback
            raise
        if os.environ.get("VLM_GRPO_TRACEBACK") and not debug:  # the one-line message hides where it came from
            raise
        if debug:  # the whole story (a user function's own traceback when it failed), then the one line
            print(getattr(err, "traceback_text", "") or traceback.format_exc(), file=sys.stderr)
        print(f"vlm-grpo {args.command}: error: {ran_out or err}", file=sys.stderr)
        return REFUSED if isinstance(err, SettingError) else FAILED


def entry() -> None:
    """The `vlm-grpo` program: main(), then exit with its code. A launched process (accelerate, torchrun) ends
    without interpreter finalization (grpo/distributed/process_exit.py says why): the group's processes meet after a
    success, the process group is taken down, and the process leaves with os._exit."""
    code = main()
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        sys.exit(code)
    from vlm_grpo.grpo.distributed.process_exit import release_group

    if code == 0:  # a failed process leaves at once: its launcher stops the others
        try:
            distributed.barrier()
        except (RuntimeError, ValueError):  # a peer already gone: leave all the same
            pass
    release_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    entry()
