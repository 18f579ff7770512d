"""`vlm-grpo eval`: greedy evaluation on a recipe split (see vlm_grpo/grpo/heldout_eval.py)."""

from __future__ import annotations

from pathlib import Path

from vlm_grpo.commands.settings import add_settings_command


def add_parser(sub) -> None:
    add_settings_command(
        sub, "eval", run,
        help="greedy evaluation: reward components, accuracy, accuracy by reasoning length",
        description="Greedy generation over --size samples of --split (default test); prints a table and writes "
        "JSON (--out, default OUTPUT_DIR/eval-SPLIT.json). Any setting as --key value, e.g. --model PATH "
        "--recipe shapes --max-new-tokens 64 --eval-batch-size 16 --length-edges 16,32,64.",
    )


def run(args, extra: list[str]) -> int:
    from vlm_grpo.grpo.training.policy import load_policy
    from vlm_grpo.grpo.heldout_eval import evaluate_run, format_report, write_report
    from vlm_grpo.grpo.settings.sources import check_sources, load_recipe_config

    cfg, recipe = load_recipe_config(args.config, extra)
    check_sources(cfg)
    out = Path(cfg.eval.out) if cfg.eval.out else Path(cfg.logging.output_dir) / f"eval-{cfg.eval.split}.json"
    check_report_path(out, "eval.out" if cfg.eval.out else "logging.output_dir")  # before the model loads
    report = evaluate_run(load_policy(cfg), recipe, cfg)
    report["model"] = cfg.model.init_from or cfg.model.name
    print(format_report(report))
    print(f"written to {write_report(report, out)}")
    return 0


def check_report_path(out: Path, key: str) -> None:
    """The report's file can be written: its folder is (or can be made) a folder, and it is not one itself."""
    from vlm_grpo.file_kinds import not_a_folder, special_kind
    from vlm_grpo.grpo.setting_fields import SettingError

    blocked = not_a_folder(out.parent) or (f"{out} is {special_kind(out)}, not a file" if special_kind(out) else None)
    if blocked:
        raise SettingError(key, f"{blocked}: the report is written to {out}; pass another --output-dir or --eval.out")
