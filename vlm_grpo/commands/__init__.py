"""CLI sub-commands that live in their own modules (listed in `vlm_grpo.cli.COMMAND_MODULES`)."""


def add_settings_command(sub, name: str, func, help: str, description: str):
    """A sub-command configured by run settings: `--config FILE` plus free `--key value` overrides
    (train, sft, eval); `func(args, extra)` receives the unparsed overrides."""
    p = sub.add_parser(name, help=help, description=description)
    p.add_argument("--config", default=None, help="YAML file of settings (command-line values win)")
    p.set_defaults(func=func, takes_extra=True)
    return p
