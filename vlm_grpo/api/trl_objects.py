"""TRL's trainer arguments as this project's parts: a model object as an adapter, `reward_funcs` as named rewards,
`peft_config` as LoRA settings, each with the record config.yaml and the model card keep of what was given."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from vlm_grpo.adapters.base import VLMAdapter
from vlm_grpo.grpo.rewards.judge import DEFAULT_QUESTION, VLMJudge
from vlm_grpo.grpo.rewards.reward_model import RewardModel
from vlm_grpo.grpo.rewards.weighted import JUDGE, model_reward, parse_reward_specs
from vlm_grpo.recipes.base import Reward

IN_MEMORY_MODEL = "memory:"  # model.name's record of a model built in Python with no path


# ------------------------------------------------------------------ the policy
def model_record(model: Any) -> str:
    """What config.yaml and the card say the run started from: the spec, the path or hub id the object was loaded
    from, or the class of a model built in Python."""
    if isinstance(model, str):
        return model
    if isinstance(model, VLMAdapter):
        return model.source or f"{IN_MEMORY_MODEL}{type(model.model).__name__}"
    return getattr(model, "name_or_path", "") or f"{IN_MEMORY_MODEL}{type(model).__name__}"


def adapter_for(model: Any, processing_class: Any = None) -> VLMAdapter:
    """A loaded model (transformers' class of a supported family, or an adapter) with its processor, as an adapter."""
    from vlm_grpo.adapters.registry import class_for_model_type

    if isinstance(model, VLMAdapter):
        if processing_class is not None:
            model.processor = processing_class
        return model
    # a PEFT-wrapped model (TRL takes one): its LoRA trains as given, the base stays frozen; the family and the
    # processor are the base model's
    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None:
        raise ValueError(f"model: expected a model spec, a path or a transformers model, got {type(model).__name__}")
    cls = class_for_model_type(config.model_type, where=f"the model given ({type(base).__name__})",
                               auto_classes=tuple(getattr(config, "auto_map", None) or ()))
    if not isinstance(base, cls.model_class):
        raise ValueError(f"model: a {type(base).__name__}; the {cls.family} family trains {cls.model_class.__name__} "
                         "(e.g. AutoModelForImageTextToText.from_pretrained)")
    if processing_class is None:
        if not base.name_or_path:
            raise ValueError("model: built in Python with no path to load its processor from: give processing_class")
        from transformers import AutoProcessor, AutoTokenizer

        loader = AutoProcessor if cls.reads_images else AutoTokenizer
        processing_class = loader.from_pretrained(base.name_or_path, trust_remote_code=False)  # never a y/N prompt
    if not cls.reads_images:  # a text-only model reads its tokenizer (or a processor's)
        return cls(model, processing_class, source=model_record(model))
    if not hasattr(processing_class, "tokenizer") or not hasattr(processing_class, "image_processor"):
        raise ValueError(f"processing_class: a vision-language model needs its processor (tokenizer and image "
                         f"processor), got {type(processing_class).__name__}")
    processing_class.tokenizer.padding_side = "left"  # prompts end where generation starts
    return cls(model, processing_class, source=model_record(model))


# ------------------------------------------------------------------ rewards
def _qualified(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial: the function inside
    module = getattr(target, "__module__", None) or "?"
    return f"{module}:{getattr(target, '__qualname__', type(target).__name__)}"


def reward_part(item: Any, processing_class: Any = None, *, device: Any = None, options: dict | None = None
                ) -> tuple[Reward, str, str]:
    """(the Reward, "rewards" | "reward_models", its record) of one `reward_funcs` entry: a function, a
    `module:function` / `file.py:function` string, a model id or path (`judge:SPEC` for a VLM judge), a loaded
    sequence-classification model or VLM, a RewardModel or VLMJudge, or a vlm_grpo adapter (a judge)."""
    options = dict(options or {})
    if isinstance(item, str):
        prefix, colon, _ = item.split("=")[-1].partition(":")
        if colon and not item.split("=")[-1].startswith(JUDGE) and prefix not in ("tiny", "preset", "pretrained"):
            return parse_reward_specs([item])[0], "rewards", item
        return model_reward(item, device=device, **options), "reward_models", item
    if isinstance(item, (RewardModel, VLMJudge)):
        if device is not None:
            (item.model if isinstance(item, RewardModel) else item.adapter.model).to(device)
        target = item.source if isinstance(item, RewardModel) else JUDGE + item.source
        return Reward(item.__name__, item), "reward_models", f"{item.__name__}={target}"
    if isinstance(item, VLMAdapter) or (hasattr(item, "config") and not type(item).__name__.endswith("ForSequenceClassification")):
        question = options.get("judge_question") or DEFAULT_QUESTION
        judge = VLMJudge(adapter_for(item, processing_class), question, device=device)
        return Reward(judge.__name__, judge), "reward_models", f"judge={JUDGE}{judge.source}"
    if hasattr(item, "config"):  # a loaded sequence-classification model, as TRL takes one
        name = (item.name_or_path or "reward_model").rstrip("/").rpartition("/")[2]
        model = RewardModel(item, processing_class, device=device, name=name)
        return Reward(model.__name__, model), "reward_models", f"{model.__name__}={model.source}"
    if callable(item):
        name = getattr(item, "__name__", None) or type(item).__name__
        return Reward(name, item), "rewards", f"{name}={_qualified(item)}"
    raise ValueError(f"reward_funcs: {item!r} is neither a function, a 'module:function' string, a model id nor a model")


def reward_parts(reward_funcs: Any, processing_classes: Any = None, **kwargs: Any) -> list[tuple[Reward, str, str]]:
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    classes = reward_processing_list(processing_classes, len(funcs))
    return [reward_part(item, cls, **kwargs) for item, cls in zip(funcs, classes)]


def reward_processing_list(processing_classes: Any, rewards: int) -> list[Any]:
    """TRL's rule: None is one None per reward; a single processing class stands for a list of one."""
    if processing_classes is None:
        return [None] * rewards
    classes = list(processing_classes) if isinstance(processing_classes, (list, tuple)) else [processing_classes]
    if len(classes) != rewards:
        raise ValueError(f"reward_processing_classes: {len(classes)} given for {rewards} reward_funcs: the number of "
                         "reward processing classes must match the number of reward functions (one per reward, None "
                         "where a reward needs none)")
    return classes


# ------------------------------------------------------------------ LoRA
# LoraConfig fields that change nothing here, or are taken over (r, alpha, dropout, targets, modules to save)
TAKEN = ("r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save")
NO_EFFECT = ("task_type", "inference_mode", "base_model_name_or_path", "revision", "peft_type", "auto_mapping")


def lora_settings(peft_config: Any) -> dict[str, Any]:
    """The settings a `peft.LoraConfig` stands for (`lora.*`, and `optim.trainable_patterns` for modules_to_save);
    a field it sets that has no same-meaning setting here is refused, named."""
    from peft import LoraConfig

    if not isinstance(peft_config, LoraConfig):
        raise ValueError(f"peft_config: a peft.LoraConfig is supported, got {type(peft_config).__name__}")
    default = LoraConfig()
    changed = [f.name for f in dataclasses.fields(LoraConfig) if f.name not in TAKEN + NO_EFFECT
               and getattr(peft_config, f.name) != getattr(default, f.name)]
    if changed:
        raise ValueError(f"peft_config: {', '.join(f'{n}={getattr(peft_config, n)!r}' for n in changed)} has no "
                         "same-meaning setting here (LoRA is built from r, lora_alpha, lora_dropout, target_modules, "
                         "modules_to_save)")
    targets = peft_config.target_modules
    if isinstance(targets, str):
        raise ValueError(f"peft_config: target_modules={targets!r} (a pattern over every module, vision tower "
                         "included): name the modules, or leave it None for the language model's projections")
    settings: dict[str, Any] = {"lora": {"r": peft_config.r, "alpha": peft_config.lora_alpha,
                                         "dropout": peft_config.lora_dropout,
                                         "target_modules": sorted(targets) if targets else None}}
    if peft_config.modules_to_save:  # peft matches a module by its name's last parts: so do these patterns
        settings["optim"] = {"trainable_patterns": [rf"(^|\.){re.escape(m)}\." for m in peft_config.modules_to_save]}
    return settings


def records(parts: Sequence[tuple[Reward, str, str]]) -> dict[str, list[str]]:
    """data.rewards and data.reward_models as config.yaml records them, each entry with its weight."""
    out: dict[str, list[str]] = {"rewards": [], "reward_models": []}
    for reward, kind, record in parts:
        named = record if "=" in record.split(":")[0] else f"{reward.name}={record}"
        out[kind].append(f"{named.rpartition('*')[0] if '*' in named else named}*{reward.weight:g}")
    return out
