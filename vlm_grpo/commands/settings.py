"""Commands configured by run settings (train, sft, eval): `--config FILE` plus free `--key value` overrides;
their `--help` lists every setting, generated from the settings dataclasses."""

from __future__ import annotations

import argparse


def settings_epilog() -> str:
    """Every setting with its help: it reads the loop's settings classes, so it is written only when help is shown."""
    from vlm_grpo.grpo.settings.sources import settings_help

    return settings_help()


def add_settings_command(sub, name: str, func, help: str, description: str):
    """A sub-command whose `func(args, extra)` receives the unparsed `--key value` overrides."""
    p = sub.add_parser(name, help=help, description=description, epilog=settings_epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="YAML file of settings (command-line values win)")
    p.set_defaults(func=func, takes_extra=True)
    return p
