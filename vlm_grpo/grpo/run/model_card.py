"""The model card every run writes to final/README.md: what was trained from what, on which task and rewards,
with which settings, and how it did on held-out data before and after."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from vlm_grpo.grpo.run.logs import METRICS, read_jsonl
from vlm_grpo.grpo.settings.sources import hub_id_of

AUDIT_FILE = "reward-audit.json"  # written by the reward audit at the start of a GRPO run


def guard_lines(run_dir: Path) -> list[str]:
    """The card's guards section: image reliance and attention to the image (first and last measurement), how many
    steps each hacking monitor tripped, and the reward audit's findings (nothing when the run logged none)."""
    rows = read_jsonl(run_dir / METRICS) if (run_dir / METRICS).is_file() else []
    lines = []
    for key, what in (("grounding/image_reliance", "image reliance vs a blank image (nats/token)"),
                      ("grounding/image_reliance_swap", "image reliance vs another image (nats/token)"),
                      ("grounding/attention_to_image", "attention of answer tokens to the image")):
        seen = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if seen:
            lines.append(f"| {what} | {seen[0][1]:.3f} (step {seen[0][0]}) | {seen[-1][1]:.3f} (step {seen[-1][0]}) |")
    last = next((r for r in reversed(rows) if any(k.startswith("guards/trips/") for k in r)), {})
    trips = {k.split("/", 2)[2]: int(v) for k, v in last.items() if k.startswith("guards/trips/")}
    if not lines and not trips:
        return []
    out = ["## Grounding and reward-hacking guards", ""]
    if lines:
        out += ["| measured on sampled completions | first | last |", "| --- | --- | --- |", *lines, ""]
    if trips:
        out += ["Steps each monitor tripped: " + ", ".join(f"{name} {n}" for name, n in trips.items()) + ".", ""]
    audit = run_dir / AUDIT_FILE
    if audit.is_file():
        report = json.loads(audit.read_text())
        found = [f"- {line}" for line in report.get("flags", [])] + [f"- {line}" for line in report.get("accepted", [])]
        out += [f"Reward audit at the start ({report.get('samples')} samples): "
                + (f"{len(report.get('flags', []))} exploits flagged" if found else "no exploit found") + ".", "",
                *found, *([""] if found else [])]
    return out


def model_card(cfg, *, stage: str, family: str, rewards, heldout: dict[str, dict[str, Any]], title: str,
               curves: str | None = None, guards: list[str] | None = None) -> str:
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
    lines += guards or []
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
    (final / "README.md").write_text(model_card(cfg, curves=curves, guards=guard_lines(run_dir), **kwargs) + "\n")
    return written + ["README.md"]
