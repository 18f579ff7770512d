"""The model card every run writes to final/README.md: what was trained from what, on which task and rewards,
with which settings, and how it did on held-out data before and after."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from vlm_grpo.grpo.run.resume_rules import describe_history
from vlm_grpo.grpo.settings.sources import hub_id_of


def model_card(cfg, *, stage: str, family: str, rewards, heldout: dict[str, dict[str, Any]], title: str,
               curves: str | None = None, history: list[dict[str, Any]] | None = None) -> str:
    spec = cfg.model.init_from or cfg.model.name
    base = hub_id_of(spec)
    lines = ["---", "library_name: transformers", "pipeline_tag: image-text-to-text", "tags: [vlm-grpo, grpo, vision-language]"]
    if base:
        lines.append(f"base_model: {base}")
    lines += ["---", "", f"# {title}", "",
              f"Trained with vlm-grpo ({stage.upper()}), {cfg.max_steps} steps, from `{spec}` ({family} family).", ""]
    lora = f"LoRA r {cfg.lora.r} (alpha {cfg.lora.alpha})" if cfg.lora.r else "full weights"
    frozen = ", ".join(sorted(cfg.optim.frozen_groups())) or "none"
    rows = [
        ("recipe", f"`{cfg.data.recipe}` {cfg.data.recipe_options or ''}".strip()),
        ("rewards", ", ".join(f"{r.name} (x{r.weight:g})" for r in rewards) or "-"),
        ("batch", f"{cfg.data.batch_size} prompts x {cfg.data.num_generations} completions per process and step"),
        ("optimizer", f"AdamW, learning rate {cfg.optim.learning_rate:g}, {cfg.optim.lr_scheduler}; {lora}; frozen: {frozen}"),
        ("loss", f"{cfg.loss.loss_type}, epsilon {cfg.loss.epsilon:g}, beta {cfg.loss.beta:g}"),
        ("generation", f"temperature {cfg.generation.temperature:g}, up to {cfg.generation.max_new_tokens} new tokens"),
        ("all settings", "`vlm_grpo_config.yaml` beside this card (a valid `vlm-grpo train --config`)"),
    ]
    lines += ["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows), ""]
    if history:  # the settings above are the last resume's; what changed at each resume, and from which step
        lines += ["## Resumes", "", *(f"- {line}" for line in describe_history(history)), ""]
    if heldout:
        names = list(next(iter(heldout.values()))["rewards"])
        lines += ["## Held-out evaluation", "",
                  f"Greedy, {next(iter(heldout.values()))['size']} samples of the `{cfg.eval.split}` split.", "",
                  "| | accuracy | reward | " + " | ".join(names) + " | completion length |",
                  "| --- " * (4 + len(names)) + "|"]
        for when, report in heldout.items():
            accuracy = "-" if report["accuracy"] is None else f"{report['accuracy']:.1%}"
            parts = " | ".join(f"{report['rewards'][n]:.3f}" for n in names)
            lines.append(f"| {when} | {accuracy} | {report['reward']:.3f} | {parts} | {report['completion_length']:.1f} |")
        lines.append("")
    if curves:
        lines += ["## Training curves", "", f"![training curves]({curves})", ""]
    return "\n".join(lines)


def write_model_card(final: Path, run_dir: Path, cfg, **kwargs) -> list[str]:
    """final/README.md, plus the run's settings and its overview chart copied beside it (final/ travels alone);
    returns the names of the files written."""
    written = []
    if (run_dir / "config.yaml").is_file():
        shutil.copyfile(run_dir / "config.yaml", final / "vlm_grpo_config.yaml")
        written.append("vlm_grpo_config.yaml")
    curves = None
    if (run_dir / "plots" / "overview.png").is_file():
        shutil.copyfile(run_dir / "plots" / "overview.png", final / "training_curves.png")
        curves = "training_curves.png"
        written.append(curves)
    (final / "README.md").write_text(model_card(cfg, curves=curves, **kwargs) + "\n")
    return written + ["README.md"]
