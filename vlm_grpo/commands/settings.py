"""Commands configured by run settings (train, sft, eval): `--config FILE` plus free `--key value` overrides."""

from __future__ import annotations


def add_settings_command(sub, name: str, func, help: str, description: str):
    """A sub-command whose `func(args, extra)` receives the unparsed `--key value` overrides."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("--config", default=None, help="YAML file of settings (command-line values win)")
    p.set_defaults(func=func, takes_extra=True)
    return p
