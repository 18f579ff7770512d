"""Command-line flags generated from settings dataclasses, never written twice.

- Commands configured by run settings (train, sft, eval): `--config FILE` (repeatable) plus free `--key value` overrides; their
  `--help` lists every setting, generated from the settings dataclasses.
- Commands with a fixed set of flags (the model flags, bench): one flag per dataclass field, with the field's type,
  default, choices and help (`add_dataclass_args`), values checked as the settings parser checks them.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing


def settings_epilog() -> str:
    """Every setting with its help: it reads the loop's settings classes, so it is written only when help is shown."""
    from vlm_grpo.grpo.settings.sources import settings_help

    return settings_help()


def add_settings_command(sub, name: str, func, help: str, description: str):
    """A sub-command whose `func(args, extra)` receives the unparsed `--key value` overrides."""
    p = sub.add_parser(name, help=help, description=description, epilog=settings_epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", default=None, metavar="FILE",
                   help="YAML file of settings; repeatable: the files are merged, and a setting in two of them is "
                   "refused (command-line values win over every file)")
    p.set_defaults(func=func, takes_extra=True)
    return p


def add_dataclass_args(p: argparse.ArgumentParser, cls: type, names: dict[str, str] | None = None,
                       only: typing.Iterable[str] | None = None, required: typing.Iterable[str] = ()) -> None:
    """One `--flag` per field of the dataclass `cls` (`names`: field -> flag name where they differ; `only`: these
    fields). Booleans are flags that switch on (`--x`) or take a value (`--x false`)."""
    from vlm_grpo.grpo.setting_fields import coerce, help_of

    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in only if only is not None else fields:
        f = fields[name]
        flag = "--" + (names or {}).get(name, name).replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = help_of(f) if "help" in f.metadata else None
        kwargs = dict(dest=name, default=default, help=help_text)
        if f.metadata.get("choices") and typing.get_origin(hints[name]) not in (list, tuple):
            kwargs["choices"] = f.metadata["choices"]
        if name in required:
            kwargs.update(required=True, default=None)
        if hints[name] is bool:
            p.add_argument(flag, nargs="?", const=True, type=lambda v, h=hints[name], k=name: coerce(v, h, k), **kwargs)
        else:
            p.add_argument(flag, type=lambda v, h=hints[name], k=name: coerce(v, h, k), **kwargs)
