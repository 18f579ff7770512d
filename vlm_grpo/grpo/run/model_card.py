"""The model card every run writes to final/README.md, made with huggingface_hub's `ModelCard` / `ModelCardData`:
what was trained from what, on which task and rewards, with which settings, and how it did on held-out data.

Its metadata says what the hub reads: `base_model` (a hub id; for a local checkpoint, the one it records: a hub
snapshot's repo, or its own card's base_model: the nearest ancestor on the hub), `license` (the base's, where its
card says), `datasets` (the hub datasets the run read), `library_name` (`peft` for a LoRA adapter), tags, and the
newest held-out evaluation as model-index metrics.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from vlm_grpo.grpo.algorithm.losses import describe as describe_loss
from vlm_grpo.grpo.data.recipe_source import HUB_ID
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.checkpoint.resume_rules import describe_history
from vlm_grpo.grpo.run.guard_report import guard_lines
from vlm_grpo.grpo.settings.sources import hub_id_of
from vlm_grpo.markdown_text import code_span, escaped

SNAPSHOT = re.compile(r"(models|datasets)--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")  # huggingface_hub's cache layout


def _front_matter(folder: Path) -> dict[str, Any]:
    """The card metadata of a local checkpoint or dataset folder (empty when it has none)."""
    from huggingface_hub import ModelCard

    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    try:
        return ModelCard.load(readme, ignore_metadata_errors=True).data.to_dict()
    except Exception:  # noqa: BLE001 - a card that does not parse says nothing about the base
        return {}


def _cached_front_matter(repo_id: str, repo_type: str = "model") -> dict[str, Any]:
    """The card metadata of a hub repo whose README is in the local cache (nothing is downloaded)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "README.md", repo_type=repo_type)
    return _front_matter(Path(found).parent) if isinstance(found, str) else {}


def _first(value: Any) -> str | None:
    return (value[0] if value else None) if isinstance(value, list) else value


def base_of(spec: str) -> tuple[str | None, str | None]:
    """(the base model's hub id, its license) for the model spec a run started from; None where unknown."""
    hub = hub_id_of(spec)
    if hub:
        return hub, _cached_front_matter(hub).get("license")
    from vlm_grpo.adapters.model_spec import parse_model_spec

    try:
        parsed = parse_model_spec(spec)
    except ValueError:  # a record of a model given in Python
        return None, None
    folder = Path(parsed.name)
    if parsed.kind != "checkpoint" or not folder.is_dir():
        return None, None
    meta = _front_matter(folder)
    snapshot = SNAPSHOT.search(str(folder.resolve()))
    if snapshot and snapshot.group(1) == "models":
        return f"{snapshot.group(2)}/{snapshot.group(3)}", meta.get("license")
    return _first(meta.get("base_model")), meta.get("license")


def datasets_of(cfg) -> list[str]:
    """The hub datasets a run read: hub ids, and local snapshots of hub datasets."""
    found = []
    for source in (cfg.data.dataset, cfg.data.eval_dataset, cfg.data.recipe_options.get("hub_id")):
        if not source:
            continue
        local = Path(source).expanduser()
        snapshot = SNAPSHOT.search(str(local.resolve())) if local.exists() else None
        if snapshot and snapshot.group(1) == "datasets":
            source = f"{snapshot.group(2)}/{snapshot.group(3)}"
        elif local.exists() or not HUB_ID.fullmatch(source):
            continue
        if source not in found:
            found.append(source)
    return found


def card_data(cfg, *, stage: str, rewards, heldout: dict[str, dict[str, Any]], title: str, lora: bool):
    """The card's metadata (huggingface_hub's ModelCardData)."""
    from huggingface_hub import EvalResult, ModelCardData

    base, license_ = base_of(cfg.model.init_from or cfg.model.name)
    datasets = datasets_of(cfg)
    results = []
    if heldout:  # the newest evaluation is this model's; "before" is the base's and stays in the table below
        report = list(heldout.values())[-1]
        dataset = {"dataset_type": datasets[-1] if datasets else cfg.data.recipe, "dataset_name": cfg.data.recipe,
                   "dataset_split": cfg.eval.split}
        values = [("accuracy", report["accuracy"]), ("reward", report["reward"]),
                  *((f"rewards/{r.name}", report["rewards"].get(r.name)) for r in rewards)]
        results = [EvalResult(task_type="image-text-to-text", metric_type=name, metric_name=name,
                              metric_value=round(float(value), 6), **dataset)
                   for name, value in values if value is not None]
    return ModelCardData(
        base_model=base, base_model_relation=("adapter" if lora else "finetune") if base else None,
        datasets=datasets or None, license=license_, library_name="peft" if lora else "transformers",
        pipeline_tag="image-text-to-text", tags=["vlm-grpo", stage, "vision-language"] + (["lora"] if lora else []),
        model_name=title, eval_results=results or None,
    )


def _source(cfg, name: str) -> str:
    """Where a reward came from, as the settings record it (`module:function`, a model), for the card."""
    for entry in [*cfg.data.rewards, *cfg.data.reward_models]:
        named, _, target = entry.partition("=") if "=" in entry.split(":")[0] else ("", "", entry)
        target = target.rpartition("*")[0] if "*" in target else target
        if named == name or (not named and target.endswith(f":{name}")):
            return f", {code_span(target, cell=True)}"
    return ""


def model_card(cfg, *, stage: str, family: str, rewards, heldout: dict[str, dict[str, Any]], title: str,
               curves: str | None = None, lora: bool = False, history: list[dict[str, Any]] | None = None,
               guards: list[str] | None = None):
    """The card (a huggingface_hub ModelCard): metadata, then what was trained, how, and the held-out results."""
    from huggingface_hub import ModelCard

    spec = cfg.model.init_from or cfg.model.name
    data = card_data(cfg, stage=stage, rewards=rewards, heldout=heldout, title=title, lora=lora)
    # every text a setting or a user's code gave (title, paths, names) renders as itself: markdown_text.py
    lines = [f"# {escaped(title)}", "", f"Trained with vlm-grpo ({stage.upper()}), {cfg.max_steps} steps, from "
             f"{code_span(spec)} ({family} family){' as a LoRA adapter' if lora else ''}.", ""]
    lora_text = f"LoRA r {cfg.lora.r} (alpha {cfg.lora.alpha})" if cfg.lora.r else "full weights"
    frozen = ", ".join(sorted(cfg.optim.frozen_groups())) or "none"
    dataset = f", data {code_span(cfg.data.dataset, cell=True)}" if cfg.data.dataset else ""
    options = f" {code_span(cfg.data.recipe_options, cell=True)}" if cfg.data.recipe_options else ""
    rows = [
        ("recipe", f"{code_span(cfg.data.recipe, cell=True)}{options}{dataset}"),
        ("rewards", ", ".join(f"{code_span(r.name, cell=True)} (x{r.weight:g}{_source(cfg, r.name)})"
                              for r in rewards) or "-"),
        ("batch", f"{cfg.data.batch_size} prompts x {cfg.data.num_generations} completions per process and step"),
        ("optimizer", f"AdamW, learning rate {cfg.optim.learning_rate:g}, {cfg.optim.lr_scheduler}; {lora_text}; "
                      f"frozen: {frozen}"),
        ("loss", describe_loss(cfg.loss)),
        ("generation", f"temperature {cfg.generation.temperature:g}, up to {cfg.generation.max_new_tokens} new tokens"),
        ("all settings", "`vlm_grpo_config.yaml` beside this card (a valid `vlm-grpo train --config`)"),
    ]
    lines += ["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows), ""]
    if history:  # the settings above are the last resume's; what changed at each resume, and from which step
        lines += ["## Resumes", "", *(f"- {escaped(line)}" for line in describe_history(history)), ""]
    if heldout:
        first = next(iter(heldout.values()))
        names = list(first["rewards"])
        lines += ["## Held-out evaluation", "", f"Greedy, {first['size']} samples of the {code_span(cfg.eval.split)} "
                  "split.", "", "| | accuracy | reward | " + " | ".join(code_span(n, cell=True) for n in names)
                  + " | completion length |",
                  "| --- " * (4 + len(names)) + "|"]
        for when, report in heldout.items():
            accuracy = "-" if report["accuracy"] is None else f"{report['accuracy']:.1%}"
            reward = "-" if report["reward"] is None else f"{report['reward']:.3f}"
            parts = " | ".join("-" if report["rewards"][n] is None else f"{report['rewards'][n]:.3f}" for n in names)
            lines.append(f"| {when} | {accuracy} | {reward} | {parts} | {report['completion_length']:.1f} |")
        lines.append("")
    lines += guards or []
    if curves:
        lines += ["## Training curves", "", f"![training curves]({curves})", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def write_model_card(final: Path, run_dir: Path, cfg, **kwargs) -> list[str]:
    """final/README.md, plus the run's settings and its overview chart copied beside it (final/ travels alone);
    returns the names of the files written."""
    def own(relative: str) -> bytes | None:  # only the run's own file travels with the model (no link followed)
        try:
            return safe_files.read_run_file(run_dir, relative)
        except safe_files.OutsideRun:
            return None

    written = []
    config = own("config.yaml")
    if config is not None and (final / "vlm_grpo_config.yaml") != run_dir / "config.yaml":
        safe_files.write_file(final / "vlm_grpo_config.yaml", config)
        written.append("vlm_grpo_config.yaml")
    curves = None
    overview = own("plots/overview.png")
    if overview is not None:
        safe_files.write_file(final / "training_curves.png", overview)
        curves = "training_curves.png"
        written.append(curves)
    model_card(cfg, curves=curves, guards=guard_lines(run_dir), **kwargs).save(final / "README.md")
    return written + ["README.md"]
