"""Every `vlm-grpo` sub-command, one module each; each exposes `add_parser(subparsers)` (see cli.py)."""
