"""Run configuration: one dataclass per component, loadable from YAML and overridable from the CLI.

`--key value` on the command line accepts `section.field` (`--loss.beta 0.04`) or a field name that
is unique across sections (`--beta 0.04`, `--max-steps 3`); dashes and underscores are the same.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vlm_grpo.grpo.guards import GuardConfig
from vlm_grpo.grpo.loss import LossConfig
from vlm_grpo.grpo.lora import LoraSettings
from vlm_grpo.grpo.optim import OptimConfig
from vlm_grpo.recipes import Recipe, get_recipe


@dataclass
class ModelConfig:
    name: str = "pretrained:shapes-tiny"  # the --model value: pretrained:N | tiny:F | preset:N | F:PATH | PATH
    dtype: str = "auto"
    device: str | None = None
    attn_implementation: str | None = None
    cache_policy: str = "auto"
    trust_remote_code: bool = False
    allow_pickle_weights: bool = False  # only safetensors checkpoints load unless this is set
    init_from: str | None = None  # a checkpoint (e.g. from `vlm-grpo sft`) to start from


@dataclass
class DataConfig:
    recipe: str = "shapes"
    train_size: int = 256
    batch_size: int = 2  # prompts per step (per process)
    num_generations: int = 4  # completions per prompt (G)
    recipe_options: dict[str, Any] = field(default_factory=dict)  # passed to the recipe's builder
    rewards: list[str] = field(default_factory=list)  # name=module:function*weight; replaces the recipe's
    on_bad_sample: str = "error"  # error | skip: a bad row stops the run naming row and field, or is skipped
    on_reward_error: str = "raise"  # raise | zero: a failing reward stops the run, or scores 0 and is counted


@dataclass
class GenerationConfig:
    max_new_tokens: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0  # = max_new_tokens ignores EOS: fixed-length completions (benchmarks)


@dataclass
class PerfConfig:
    """How a step shares work across a prompt's G completions. All on by default; off only to debug."""

    shared_prefix: bool = True  # rollout: encode + prefill each prompt once, sample its G completions from that cache
    share_image_features: bool = True  # log-prob forwards: encode each image once, place it into its G sequences
    reuse_frozen_features: bool = True  # vision tower + projector frozen: reuse the rollout's features, no encoder call
    logprob_chunk_mb: int = 256  # fp32 working set of one log-prob chunk (never a full [rows, T, vocab] in fp32)


@dataclass
class LoggingConfig:
    output_dir: str = "runs/latest"
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    keep_checkpoints: int = 2
    log_completions: bool = True
    report_to: list[str] = field(default_factory=list)  # accelerate trackers: tensorboard, wandb, mlflow
    progress: bool = True
    save_merged: bool = True  # with LoRA, also write a merged copy of the final model
    plot: bool = False  # train/sft commands: write the run's charts (reward, accuracy, held-out ...) to <output_dir>/plots


@dataclass
class SFTConfig:
    """`vlm-grpo sft`: supervised warm-up on the recipe's reference responses. Steps, batch size, learning
    rates, freezing and LoRA come from the shared settings (max_steps, data.batch_size, optim.*, lora.*)."""

    max_reference_tokens: int = 256  # longer references (end-of-turn token included) are cut
    eval_every: int = 0  # > 0: greedy held-out evaluation (the eval section's split/size) every N steps and at the end


@dataclass
class EvalConfig:
    """`vlm-grpo eval` (and held-out evaluation inside a run): greedy decoding over a split."""

    split: str = "test"
    size: int = 64
    eval_batch_size: int = 8
    length_edges: list[int] = field(default_factory=list)  # reasoning-length bucket edges; empty: quartiles
    out: str | None = None  # JSON report; None: <output_dir>/eval-<split>.json
    data_seed: int | None = None  # seed of the evaluated samples; None: the run's seed (fix it to compare seeds)
    before_after: bool = False  # `train`: evaluate the policy before the first and after the last GRPO step


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    max_steps: int = 3
    scale_rewards: str = "group"  # group | batch | none: what the group advantage is divided by
    num_iterations: int = 1  # optimizer updates per rollout batch
    gradient_accumulation_steps: int = 1  # micro-batches per update (whole groups each)
    mixed_precision: str = "no"  # no | bf16 | fp16
    seed: int = 0
    resume: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = tuple(f.name for f in dataclasses.fields(TrainConfig) if dataclasses.is_dataclass(getattr(TrainConfig(), f.name)))
ALIASES = {"model": ("model", "name")}  # `--model X` sets model.name


def _resolve(cfg: TrainConfig, key: str) -> tuple[Any, dataclasses.Field]:
    key = key.lstrip("-").replace("-", "_")
    if key in ALIASES:
        section, name = ALIASES[key]
        key = f"{section}.{name}"
    if "." in key:
        section, name = key.split(".", 1)
        target = getattr(cfg, section, None)
        if section not in SECTIONS or name not in {f.name for f in dataclasses.fields(target)}:
            raise ValueError(f"unknown setting {key!r}")
        return target, next(f for f in dataclasses.fields(target) if f.name == name)
    top = [f for f in dataclasses.fields(cfg) if f.name == key and f.name not in SECTIONS]
    matches = [(cfg, f) for f in top]
    for section in SECTIONS:
        obj = getattr(cfg, section)
        matches += [(obj, f) for f in dataclasses.fields(obj) if f.name == key]
    if not matches:
        raise ValueError(f"unknown setting {key!r}; use section.field, sections: {', '.join(SECTIONS)}")
    if len(matches) > 1:
        where = [type(o).__name__ for o, _ in matches]
        raise ValueError(f"setting {key!r} is ambiguous ({', '.join(where)}); write it as section.field")
    return matches[0]


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    hint = annotation
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        hint = options[0]
        origin = typing.get_origin(hint)
    if isinstance(value, str) and hint is not str:
        value = yaml.safe_load(value)
    try:
        if hint is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if hint in (int, float):
            if isinstance(value, bool):
                raise TypeError
            return hint(value)
        if hint is str:
            return str(value)
        if origin in (list, tuple):
            items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v]
            (item_type, *_) = typing.get_args(hint) or (str,)
            items = [_coerce(v, item_type, key) for v in items]
            return tuple(items) if origin is tuple else items
        if origin is dict:
            if not isinstance(value, dict):
                raise TypeError
            return value
    except (TypeError, ValueError):
        raise ValueError(f"setting {key!r}: {value!r} is not a valid {getattr(hint, '__name__', hint)}") from None
    return value


def set_value(cfg: TrainConfig, key: str, value: Any) -> None:
    target, f = _resolve(cfg, key)
    hints = typing.get_type_hints(type(target))
    setattr(target, f.name, _coerce(value, hints[f.name], key))


def apply_overrides(cfg: TrainConfig, args: list[str]) -> TrainConfig:
    """`--key value` pairs (a bare `--flag` means true)."""
    i = 0
    while i < len(args):
        key = args[i]
        if not key.startswith("--"):
            raise ValueError(f"expected --key value, got {key!r}")
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            set_value(cfg, key, args[i + 1])
            i += 2
        else:
            set_value(cfg, key, True)
            i += 1
    return cfg


def apply_mapping(cfg: TrainConfig, data: dict[str, Any], prefix: str = "") -> TrainConfig:
    for key, value in data.items():
        if key in SECTIONS and isinstance(value, dict):
            apply_mapping(cfg, value, prefix=f"{key}.")
        else:
            set_value(cfg, f"{prefix}{key}", value)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, base: dict | None = None) -> TrainConfig:
    """Defaults <- recipe/base mapping <- YAML file <- command-line overrides."""
    cfg = TrainConfig()
    if base:
        apply_mapping(cfg, base)
    if path:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a config file must hold a mapping of settings")
        apply_mapping(cfg, data)
    if overrides:
        apply_overrides(cfg, overrides)
    cfg.loss.max_completion_length = cfg.generation.max_new_tokens
    return cfg


def merge_settings(*layers: dict[str, Any]) -> dict[str, Any]:
    """Setting mappings merged section by section; a later layer wins."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key in SECTIONS and isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def load_recipe_config(path: str | Path | None = None, overrides: list[str] | None = None) -> tuple[TrainConfig, Recipe]:
    """(settings, recipe): `load_config` with defaults underneath the file and the command line: the chosen
    recipe's, then, when the policy is a checkpoint shipped in the package (`pretrained:NAME`, no `init_from`)
    and the recipe is the one it was trained for, the GRPO settings that go with it (vlm_grpo/pretrained)."""
    from vlm_grpo import pretrained

    cfg = load_config(path, overrides)
    recipe = get_recipe(cfg.data.recipe)
    layers = [recipe.defaults]
    if cfg.model.init_from is None:
        model_defaults = pretrained.run_defaults(cfg.model.name)
        if model_defaults.get("data", {}).get("recipe", cfg.data.recipe) == cfg.data.recipe:
            layers.append(model_defaults)
    base = merge_settings(*layers)
    return (load_config(path, overrides, base=base) if base else cfg), recipe
