"""`vlm-grpo train`: GRPO training (api/trainers.py: GRPOTrainer.from_settings); with no arguments, the offline default run."""

from __future__ import annotations

from vlm_grpo.commands.settings import add_settings_command


STARTUP_PACKAGES = ("torch", "transformers", "accelerate", "peft")  # printed as a run starts: what its figures came from


def add_parser(sub) -> None:
    add_settings_command(
        sub, "train", run,
        help="GRPO training",
        description="GRPO training. Any setting can be given as --key value (e.g. --model tiny:smolvlm "
        "--recipe shapes --max-steps 3 --output-dir runs/x --loss.beta 0.04 --vision-lr 1e-6 --resume). The "
        "defaults below are this command's, sized for a first run on a CPU (and a recipe's own, which replace "
        "them); a GRPOConfig built in Python takes TRL's defaults instead (docs/coming-from-trl.md).",
    )


def run(args, extra: list[str]) -> int:
    from vlm_grpo.compat.tested_window import installed
    from vlm_grpo.grpo.settings.sources import load_recipe_config

    print("versions: " + ", ".join(f"{p} {installed(p) or 'not installed'}" for p in STARTUP_PACKAGES), flush=True)

    # recipe defaults (and a shipped checkpoint's GRPO settings) sit under the file and the command line
    cfg, recipe = load_recipe_config(args.config, extra)
    from vlm_grpo.api.trainers import GRPOTrainer  # after the settings: a refused one costs no trainer import

    trainer = GRPOTrainer.from_settings(cfg, recipe=recipe)  # the run writes its charts and report itself
    trainer.train()
    history = trainer.history
    if history and trainer.is_main:
        last = history[-1]
        print(f"done: {len(history)} steps, last reward {last['reward']:.3f}; run directory {cfg.logging.output_dir}")
    return 0
