"""CLI sub-commands that live in their own modules (listed in `vlm_grpo.cli.COMMAND_MODULES`)."""
