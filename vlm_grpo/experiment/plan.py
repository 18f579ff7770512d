"""An experiment's config: what each stage runs, read from one YAML file plus `--set key=value` overrides, checked
before anything runs (a wrong key names itself and the file)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vlm_grpo.grpo.settings.sources import refuse_trust_keys

STAGES = ("compose", "align", "sft", "grpo", "eval")
TRAINING_STAGES = ("align", "sft", "grpo")
TOP_KEYS = {"name", "output_dir", "base_seed", "compose", "eval", *TRAINING_STAGES}
COMPOSE_KEYS = {"llm", "vision", "tower", "tower_pretrain"}
TOWER_PRETRAIN_KEYS = {"steps", "batch_size", "learning_rate"}
TOWER_PRETRAIN_OPTIONAL = {"counts"}
WORDS_KEYS = TOWER_PRETRAIN_KEYS  # align.words: the projector trained to the LM's words, a loop of the same shape
WORDS_ALIGN_KEYS = {"words", "data"}
EVAL_KEYS = {"splits", "size", "eval_batch_size", "data_seed", "max_new_tokens", "image_reliance", "samples", "dtype", "data"}
EVAL_DATA_KEYS = {"recipe", "recipe_options"}  # eval.data: the questions, when not the GRPO stage's
# set by the runner for every training stage: where the model comes from, where the run goes, its seed
RUNNER_KEYS = {"seed", "resume", "resume_from"}
RUNNER_MODEL_KEYS = {"name", "init_from"}  # the rest of the model section (dtype ...) is the stage's own


class ExperimentError(ValueError):
    """A config that cannot run: names the file and the key."""


@dataclass
class Experiment:
    source: str
    name: str
    output_dir: Path
    base_seed: int
    compose: dict[str, Any]
    stages: dict[str, dict[str, Any]]  # align, sft, grpo: settings as `vlm-grpo sft/train --config` reads them
    eval: dict[str, Any] = field(default_factory=dict)

    def aligns_to_words(self) -> bool:
        """The align stage trains the projector to the LM's words (words.py), not by `vlm-grpo sft` settings."""
        return "words" in self.stages["align"]

    def base_dir(self) -> Path:
        """Compose and align run once, with `base_seed`: the aligned model every seed starts from."""
        return self.output_dir / f"base-seed{self.base_seed}"

    def seed_dir(self, seed: int) -> Path:
        return self.output_dir / f"seed{seed}"

    def stage_dir(self, stage: str, seed: int) -> Path:
        return self.base_dir() / stage if stage in ("compose", "align") else self.seed_dir(seed) / stage


def set_value(data: dict[str, Any], assignment: str, source: str) -> None:
    """`a.b.c=VALUE` (VALUE read as YAML) into `data`, creating the sections on the way."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise ExperimentError(f"{source}: --set {assignment!r}: write KEY=VALUE, e.g. grpo.max_steps=4")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ExperimentError(f"{source}: --set {key}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = yaml.safe_load(raw)


def read_experiment(path: str | Path, overrides: list[str] = ()) -> Experiment:
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ExperimentError(f"experiment config {source} does not exist") from None
    except yaml.YAMLError as err:
        raise ExperimentError(f"{source} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ExperimentError(f"{source}: the file must hold a mapping of sections ({', '.join(sorted(TOP_KEYS))})")
    data = copy.deepcopy(data)
    for assignment in overrides:
        set_value(data, assignment, source)
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ExperimentError(f"{source}: unknown key(s) {unknown}; known: {', '.join(sorted(TOP_KEYS))}")
    compose = _section(data, "compose", source)
    if sorted(set(compose) - COMPOSE_KEYS):
        raise ExperimentError(f"{source}: compose: unknown key(s) {sorted(set(compose) - COMPOSE_KEYS)}; "
                              f"known: {', '.join(sorted(COMPOSE_KEYS))}")
    if not compose.get("llm"):
        raise ExperimentError(f"{source}: compose.llm is required (a causal LM checkpoint, a .gguf file, or smollm2)")
    if bool(compose.get("vision")) == bool(compose.get("tower")):
        raise ExperimentError(f"{source}: compose needs exactly one of vision (a SigLIP/CLIP checkpoint) or tower "
                              "(the SigLIP vision config of a random tower, trained by the align stage)")
    pretrain = compose.get("tower_pretrain")
    if pretrain is not None:
        if (not compose.get("tower") or not isinstance(pretrain, dict) or not TOWER_PRETRAIN_KEYS <= set(pretrain)
                or set(pretrain) - TOWER_PRETRAIN_KEYS - TOWER_PRETRAIN_OPTIONAL):
            raise ExperimentError(f"{source}: compose.tower_pretrain pretrains the random tower (compose.tower) and "
                                  f"takes {', '.join(sorted(TOWER_PRETRAIN_KEYS))}, and optionally "
                                  f"{', '.join(sorted(TOWER_PRETRAIN_OPTIONAL))}")
    stages = {}
    for stage in TRAINING_STAGES:
        settings = _section(data, stage, source)
        taken = sorted(RUNNER_KEYS & set(settings))
        if taken:
            raise ExperimentError(f"{source}: {stage}: {taken} are set by the experiment (the model is the previous "
                                  "stage's, the seed is --seed, resuming is automatic); remove them")
        if RUNNER_MODEL_KEYS & set(settings.get("model") or {}):
            raise ExperimentError(f"{source}: {stage}: model.name and model.init_from are set by the experiment "
                                  "(the composed model, the previous stage's final/); remove them")
        if "output_dir" in settings.get("logging", {}):
            raise ExperimentError(f"{source}: {stage}: logging.output_dir is set by the experiment (OUTPUT_DIR/...)")
        refuse_trust_keys(settings, f"{source}: {stage}")
        if stage == "align" and "words" in settings:
            check_words_align(settings, source)
        stages[stage] = settings
    evaluation = _section(data, "eval", source)
    refuse_trust_keys(evaluation, f"{source}: eval")
    if sorted(set(evaluation) - EVAL_KEYS):
        raise ExperimentError(f"{source}: eval: unknown key(s) {sorted(set(evaluation) - EVAL_KEYS)}; "
                              f"known: {', '.join(sorted(EVAL_KEYS))}")
    if "data" in evaluation:
        check_eval_data(evaluation["data"], source)
    return Experiment(source=source, name=str(data.get("name") or Path(path).stem),
                      output_dir=Path(data.get("output_dir") or f"runs/{Path(path).stem}"),
                      base_seed=int(data.get("base_seed", 0)), compose=compose, stages=stages, eval=evaluation)


def check_words_align(settings: dict[str, Any], source: str) -> None:
    words = settings["words"]
    if not isinstance(words, dict) or set(words) != WORDS_KEYS:
        raise ExperimentError(f"{source}: align.words trains the projector to the LM's words and takes exactly "
                              f"{', '.join(sorted(WORDS_KEYS))}")
    if sorted(set(settings) - WORDS_ALIGN_KEYS):
        raise ExperimentError(f"{source}: align with words takes only {', '.join(sorted(WORDS_ALIGN_KEYS))} (data names "
                              f"the recipe whose cell_words it learns); unknown here: {sorted(set(settings) - WORDS_ALIGN_KEYS)}")
    counts_ok = all(isinstance(words[k], int) and not isinstance(words[k], bool) and words[k] > 0 for k in ("steps", "batch_size"))
    rate = words["learning_rate"]
    if not counts_ok or isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
        raise ExperimentError(f"{source}: align.words: steps and batch_size must be positive integers and learning_rate a "
                              f"positive number (got {words})")


def check_eval_data(task: Any, source: str) -> None:
    if not isinstance(task, dict) or not task.get("recipe") or set(task) - EVAL_DATA_KEYS:
        raise ExperimentError(f"{source}: eval.data names the questions every model is asked: a recipe and, optionally, "
                              f"its recipe_options (got {task!r}); leave it out to ask the GRPO stage's")
    if not isinstance(task.get("recipe_options") or {}, dict):
        raise ExperimentError(f"{source}: eval.data.recipe_options must be a mapping, got {task['recipe_options']!r}")


def _section(data: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise ExperimentError(f"{source}: {key} must be a mapping, got {type(value).__name__}")
    return value
