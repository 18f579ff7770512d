"""`vlm-grpo sft`: supervised warm-up on a recipe's reference responses (see vlm_grpo/grpo/sft.py)."""

from __future__ import annotations

from vlm_grpo.commands.settings import add_settings_command

DEFAULT_RUN_DIR = "runs/latest"  # LoggingConfig's default: an SFT run without --output-dir goes elsewhere
SFT_RUN_DIR = "runs/sft-latest"


def add_parser(sub) -> None:
    add_settings_command(
        sub, "sft", run,
        help="supervised warm-up on the recipe's reference responses (before GRPO)",
        description="Supervised fine-tuning on each sample's reference response, loss on completion tokens only. "
        "Settings as for train (--model, --recipe, --max-steps, --batch-size, --learning-rate, --freeze, --lora.r, "
        "--output-dir (default runs/sft-latest), --sft.max_reference_tokens ...). The model in OUTPUT_DIR/final "
        "starts a GRPO run with `vlm-grpo train --init-from OUTPUT_DIR/final`.",
    )


def run(args, extra: list[str]) -> int:
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    cfg, recipe = load_recipe_config(args.config, extra)
    from vlm_grpo.api.trainers import SFTTrainer  # after the settings: a refused one costs no trainer import

    if cfg.logging.output_dir == DEFAULT_RUN_DIR:
        cfg.logging.output_dir = SFT_RUN_DIR  # never overwrite a GRPO run by accident
    trainer = SFTTrainer.from_settings(cfg, recipe=recipe)  # the run writes its charts and report itself
    trainer.train()
    history = trainer.history
    if history and trainer.is_main:
        first, last = history[0]["loss"], history[-1]["loss"]
        final = trainer.run_dir / "final"
        print(f"done: {len(history)} SFT steps, loss {first:.4f} -> {last:.4f}; model in {final}")
        data = f" --dataset {cfg.data.dataset}" if cfg.data.dataset else ""
        print(f"continue with GRPO: vlm-grpo train --init-from {final} --recipe {cfg.data.recipe}{data} ...")
    return 0
