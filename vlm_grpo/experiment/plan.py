"""An experiment's config: what each stage runs, read from one YAML file plus `--set key=value` overrides, checked
before anything runs (a wrong key names itself and the file)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_grpo.grpo.settings.sources import mapping_pairs, refuse_repeated, refuse_trust_keys
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.yaml_text import YAMLProblem, load_yaml

STAGES = ("compose", "align", "sft", "grpo", "eval")  # the arms run between grpo and eval (Experiment.stage_names)
TRAINING_STAGES = ("align", "sft", "grpo")
TOP_KEYS = {"name", "output_dir", "base_seed", "independent_seeds", "compose", "eval", "arms", *TRAINING_STAGES}
# arms: more models trained from the SFT checkpoint beside GRPO, each a stage (arms.py says what each method does)
ARM_METHODS = ("grpo", "answer_sft", "rft", "sft_more")
ARM_KEYS = {"method", "set", "question_types"}
ARM_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
COMPOSE_KEYS = {"llm", "vision", "tower", "tower_pretrain"}
TOWER_PRETRAIN_KEYS = {"steps", "batch_size", "learning_rate"}
TOWER_PRETRAIN_OPTIONAL = {"counts"}
WORDS_KEYS = TOWER_PRETRAIN_KEYS  # align.words: the projector trained to the LM's words, a loop of the same shape
WORDS_ALIGN_KEYS = {"words", "data"}
EVAL_KEYS = {"splits", "test_splits", "size", "eval_batch_size", "data_seed", "max_new_tokens", "image_reliance", "samples", "dtype", "data"}
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
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {method, set, question_types}
    # true: every seed composes and aligns its own tower and projector (base-seedN), nothing shared between seeds;
    # false: compose and align run once with base_seed and every seed starts from that aligned model
    independent_seeds: bool = False

    def stage_names(self) -> tuple[str, ...]:
        """Every stage in pipeline order: compose, align, sft, grpo, the arms in file order, eval."""
        return (*STAGES[:4], *self.arms, STAGES[4])

    def models(self) -> tuple[str, ...]:
        """The models each seed evaluates and reports, in order: base (the aligned model), sft, grpo, the arms."""
        return ("base", "sft", "grpo", *self.arms)

    def base_seed_of(self, seed: int) -> int:
        """The seed compose and align run with for `seed`'s models."""
        return seed if self.independent_seeds else self.base_seed

    def aligns_to_words(self) -> bool:
        """The align stage trains the projector to the LM's words (words.py), not by `vlm-grpo sft` settings."""
        return "words" in self.stages["align"]

    def base_dir(self, seed: int) -> Path:
        """Where compose and align of `seed`'s models run: base-seedN of base_seed_of(seed)."""
        return self.output_dir / f"base-seed{self.base_seed_of(seed)}"

    def seed_dir(self, seed: int) -> Path:
        return self.output_dir / f"seed{seed}"

    def stage_dir(self, stage: str, seed: int) -> Path:
        return self.base_dir(seed) / stage if stage in ("compose", "align") else self.seed_dir(seed) / stage


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
    try:
        node[parts[-1]] = load_yaml(raw, key, inline=True)
    except YAMLProblem as err:
        raise ExperimentError(f"{source}: --set {key}: {err}") from None


def read_experiment(path: str | Path, overrides: list[str] = ()) -> Experiment:
    source = str(path)
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"), source)  # a key written twice is refused
    except FileNotFoundError:
        raise ExperimentError(f"experiment config {source} does not exist") from None
    except YAMLProblem as err:
        raise ExperimentError(str(err)) from None
    if not isinstance(data, dict):
        raise ExperimentError(f"{source}: the file must hold a mapping of sections ({', '.join(sorted(TOP_KEYS))})")
    data = copy.deepcopy(data)
    given: dict[str, str] = {}
    for assignment in overrides:
        key = assignment.partition("=")[0].strip()
        if key in given:
            raise ExperimentError(f"{source}: --set {key} is given twice ({given[key]!r} and {assignment!r}); "
                                  "keep one")
        given[key] = assignment
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
        refuse_spellings(settings, f"{source}: {stage}")
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
    check_splits(evaluation, source)
    whole_number(evaluation.get("samples", 4), "eval.samples", source)  # the summary's changed answers shown
    arms = {name: check_arm(name, arm, source) for name, arm in _section(data, "arms", source).items()}
    independent = data.get("independent_seeds", False)
    if not isinstance(independent, bool):
        raise ExperimentError(f"{source}: independent_seeds must be true or false, got {independent!r}")
    return Experiment(source=source, name=str(data.get("name") or Path(path).stem),
                      output_dir=Path(data.get("output_dir") or f"runs/{Path(path).stem}"),
                      base_seed=whole_number(data.get("base_seed", 0), "base_seed", source), compose=compose,
                      stages=stages, eval=evaluation, arms=arms, independent_seeds=independent)


def check_arm(name: Any, arm: Any, source: str) -> dict[str, Any]:
    """An arm: a method, optionally `set` (settings over the stage it copies: grpo's for a GRPO variant, sft's for
    the others) and `question_types` (answer_sft, rft: the GRPO prompts of these types only)."""
    where = f"{source}: arms.{name}"
    if not isinstance(name, str) or not ARM_NAME.fullmatch(name) or name in (*STAGES, "base", "none"):
        raise ExperimentError(f"{source}: arms: {name!r} is not a usable name (lower-case letters, digits and _, "
                              f"starting with a letter; not {', '.join((*STAGES, 'base', 'none'))})")
    if not isinstance(arm, dict) or arm.get("method") not in ARM_METHODS or set(arm) - ARM_KEYS:
        raise ExperimentError(f"{where}: an arm is a mapping with method ({', '.join(ARM_METHODS)}) and optionally "
                              f"set, question_types; got {arm!r}")
    overrides = arm.get("set") or {}
    if not isinstance(overrides, dict):
        raise ExperimentError(f"{where}.set must be a mapping of settings, got {overrides!r}")
    taken = sorted(RUNNER_KEYS & set(overrides))
    if taken or RUNNER_MODEL_KEYS & set(overrides.get("model") or {}) or "output_dir" in (overrides.get("logging") or {}):
        raise ExperimentError(f"{where}.set: the seed, resuming, the model and logging.output_dir are set by the "
                              "experiment; remove them")
    refuse_trust_keys(overrides, where)
    refuse_spellings(overrides, f"{where}.set")
    types = arm.get("question_types")
    if types is not None and (arm["method"] not in ("answer_sft", "rft") or not isinstance(types, list) or not types
                              or not all(isinstance(t, str) and t for t in types)):
        raise ExperimentError(f"{where}.question_types: a non-empty list of question types (the recipe's "
                              f"question_type field), for answer_sft and rft only; got {types!r}")
    return {"method": arm["method"], "set": copy.deepcopy(overrides), "question_types": types}


def refuse_spellings(settings: dict[str, Any], where: str) -> None:
    """One setting written twice in a stage (a TRL name beside this project's): an ExperimentError naming both."""
    try:
        refuse_repeated(mapping_pairs(settings), where)
    except SettingError as err:
        raise ExperimentError(str(err)) from None


def whole_number(value: Any, key: str, source: str) -> int:
    """A count or seed as written: an integer >= 0 (YAML's true is not 1, nor "3" a number)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExperimentError(f"{source}: {key} must be a whole number >= 0, got {value!r}")
    return value


def check_splits(evaluation: dict[str, Any], source: str) -> None:
    """eval.splits: where design choices are judged (validation splits); eval.test_splits: the final table's, asked
    only with --test. A split in both would let a design choice see the test questions."""
    for key in ("splits", "test_splits"):
        value = evaluation.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ExperimentError(f"{source}: eval.{key} must be a list of split names, got {value!r}")
    both = sorted(set(evaluation.get("splits", [])) & set(evaluation.get("test_splits", [])))
    if both:
        raise ExperimentError(f"{source}: eval: {both} are in both splits (validation, for design choices) and "
                              "test_splits (the final table): a split is one or the other")


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
