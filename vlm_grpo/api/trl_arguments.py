"""TRL's trainer arguments as a run's settings and inputs: what is given is turned into the run's parts
(api/trl_objects.py) and recorded in its settings, so config.yaml and the model card say what the run was made of: a
model object by the path it was loaded from (or its class), a function by its qualified name, rows in memory by
their type, fingerprint, columns and size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlm_grpo.api.trl_objects import adapter_for, lora_settings, model_record, records, reward_parts
from vlm_grpo.grpo.data.recipe_source import MEMORY, remember_rows
from vlm_grpo.grpo.rewards.weighted import weighed
from vlm_grpo.grpo.settings.sources import load_recipe_config, merge_settings


def apply_process_settings(schedule: dict[str, Any]) -> None:
    """TRL's process-wide settings, applied as transformers' Trainer applies them: log_level (vlm_grpo's and
    transformers' loggers; "passive" leaves them) and tf32 (torch's matmul and cuDNN switches; None leaves them)."""
    import logging

    import torch
    from transformers.utils import logging as hf_logging

    level = schedule.get("log_level", "passive")
    if level not in (None, "passive"):
        number = hf_logging.log_levels[level]
        hf_logging.set_verbosity(number)
        logging.getLogger("vlm_grpo").setLevel(number)
    if schedule.get("tf32") is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(schedule["tf32"])


def rows_record(data: Any, name: str) -> str:
    """A dataset argument as data.dataset holds it: a path or hub id as given, rows in memory as their record."""
    return data if isinstance(data, (str, Path)) else remember_rows(data, name)


def settings_of(args: Any, model: Any, reward_funcs: Any, train_dataset: Any, eval_dataset: Any,
                processing_class: Any, reward_processing_classes: Any, optimizers: tuple, peft_config: Any):
    """(settings, recipe, the run's inputs: adapter and rewards) of TRL's trainer arguments."""
    import torch

    if any(part is not None for part in optimizers or ()):
        raise ValueError("optimizers: the optimizer is built here, one learning rate per module group "
                         "(optim.learning_rate, vision_lr, projector_lr ...); give optimizers=(None, None)")
    layers = [args.mapping(), {"model": {"name": str(model_record(model))}}]
    data = {}
    if train_dataset is not None:
        data["dataset"] = str(rows_record(train_dataset, "train_dataset"))
    if eval_dataset is not None:
        data["eval_dataset"] = str(rows_record(eval_dataset, "eval_dataset"))
    layers.append({"data": data})
    if peft_config is not None:
        layers.append(lora_settings(peft_config))
    cfg, recipe = load_recipe_config(settings=merge_settings(*layers))
    schedule = getattr(args, "schedule", {})
    apply_process_settings(schedule)
    scheduled = schedule.get("eval_strategy", "no") != "no" or schedule.get("eval_on_start")
    if scheduled and cfg.data.eval_dataset is None and str(cfg.data.dataset or "").startswith(MEMORY):
        raise ValueError(f"eval_strategy={schedule.get('eval_strategy')!r}: rows given in Python have no held-out "
                         "split; give GRPOTrainer(eval_dataset=...) (TRL refuses this too)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the run's accelerator puts it
    rewards = None
    if reward_funcs is not None:
        options = {"judge_question": cfg.data.judge_question, "seed": cfg.seed,
                   "trust_remote_code": cfg.model.trust_remote_code,
                   "allow_pickle_weights": cfg.model.allow_pickle_weights}
        parts = reward_parts(reward_funcs, reward_processing_classes, device=device, options=options)
        rewards = weighed([reward for reward, _, _ in parts], cfg.data.reward_weights)
        written = records(parts)  # each entry with its weight: config.yaml reads back the same rewards
        cfg.data.rewards, cfg.data.reward_models, cfg.data.reward_weights = (
            written["rewards"], written["reward_models"], [])
    adapter = None
    if not isinstance(model, str):
        adapter = adapter_for(model, processing_class)
    elif processing_class is not None:
        from vlm_grpo.grpo.training.policy import load_policy

        adapter = adapter_for(load_policy(cfg, device), processing_class)
    return cfg, recipe, {"adapter": adapter, "rewards": rewards}

