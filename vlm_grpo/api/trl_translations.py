"""How TRL's GRPOConfig values become this project's settings where the two count differently (api/trl_fields.py
holds the table that names these): each takes the value and every keyword given, and returns settings as dotted keys
(`trl.NAME` for what the API's trainer schedule reads)."""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from vlm_grpo.grpo.setting_fields import SettingError

VLLM = "vLLM rollouts: see issue/README"


def same(key: str) -> Callable[[Any, dict], dict]:
    """The value as it is, under our key; None (TRL's "unset") leaves our default."""
    return lambda v, _: {} if v is None else {key: v}


def dict_or_empty(key: str) -> Callable[[Any, dict], dict]:
    return lambda v, _: {key: dict(v or {})}


def schedule(name: str) -> Callable[[Any, dict], dict]:
    """A field the API's trainer schedule reads (logging, evaluation moments); kept under `trl.NAME`."""
    return lambda v, _: {f"trl.{name}": v}


# ------------------------------------------------------------------ translations that need more than one field
def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


BATCH_FIELDS = ("per_device_train_batch_size", "generation_batch_size", "steps_per_generation")


def batch(given: dict) -> dict:
    """TRL's batch shape (completions per device per micro-step, per generation) as prompts per step per process.

    TRL: a generation holds per_device_train_batch_size x processes x steps_per_generation completions, i.e. that /
    num_generations prompts, and an optimizer step takes gradient_accumulation_steps micro-steps. Here a step samples
    data.batch_size prompts per process, num_generations completions each, and makes one update over them in
    micro-batches of whole prompt groups: the same prompts per generation and completions per update when
    steps_per_generation = gradient_accumulation_steps (TRL's default)."""
    from vlm_grpo.grpo.settings.sections import DataConfig

    if "batch_size" in given or "data.batch_size" in given:
        raise SettingError("per_device_train_batch_size", "give TRL's per_device_train_batch_size (completions) or "
                           "data.batch_size (prompts), not both")
    per_device = given.get("per_device_train_batch_size", 8)
    accumulation = given.get("gradient_accumulation_steps", 1)
    g = given.get("num_generations") or DataConfig().num_generations
    n = world_size()
    gbs, spg = given.get("generation_batch_size"), given.get("steps_per_generation")
    if gbs is not None and spg is not None:
        raise SettingError("generation_batch_size", "'generation_batch_size' and 'steps_per_generation' cannot both be "
                           "set (as in TRL)")
    if gbs is not None:
        if gbs % (per_device * n):
            raise SettingError("generation_batch_size", f"{gbs} is not a multiple of the global batch size "
                               f"({per_device} x {n} processes)")
        spg = gbs // (per_device * n)
    spg = accumulation if spg is None else spg
    if spg % accumulation:
        raise SettingError("steps_per_generation", f"{spg} is not a multiple of gradient_accumulation_steps "
                           f"({accumulation}): here a generation feeds whole optimizer steps")
    completions = per_device * spg
    if completions % g:
        raise SettingError("per_device_train_batch_size", f"{per_device} x steps_per_generation {spg} = {completions} "
                           f"completions per process is not whole groups of num_generations ({g})")
    prompts = completions // g
    if spg > accumulation:  # one generation, shuffled, feeds spg / accumulation optimizer steps of `per_device` rows
        return {"data.batch_size": prompts, "data.num_generations": g, "gradient_accumulation_steps": accumulation,
                "steps_per_generation": spg // accumulation}
    # micro-batches hold whole prompt groups: as many as divide the prompts (the update is the same, memory differs)
    return {"data.batch_size": prompts, "data.num_generations": g,
            "gradient_accumulation_steps": math.gcd(prompts, accumulation)}


def length(given: dict) -> dict:
    """TRL: max_steps > 0 wins; else num_train_epochs (default 3.0) passes over the training split."""
    steps = given.get("max_steps", -1)
    if steps is not None and steps > 0:
        return {"max_steps": steps, "epochs": 0.0}
    epochs = given.get("num_train_epochs", 3.0)
    if not epochs or epochs <= 0:
        raise SettingError("num_train_epochs", f"{epochs!r}: with max_steps={steps} the run length comes from "
                           "num_train_epochs, which must be > 0")
    return {"epochs": float(epochs)}


def betas(given: dict) -> dict:
    return {"optim.adam_betas": [given.get("adam_beta1", 0.9), given.get("adam_beta2", 0.999)]}


def warmup(v, _):
    if v is None or v == 0:
        return {"optim.warmup_steps": 0}
    if isinstance(v, float) and 0 < v < 1:  # transformers: a float below 1 is a share of the run's steps
        return {"optim.warmup_ratio": v}
    return {"optim.warmup_steps": int(v)}


def report_to(v, _):
    from vlm_grpo.grpo.settings.sections import TRACKERS

    if v is None or v == "none" or v == ["none"]:
        return {"logging.report_to": []}
    if v == "all" or v == ["all"]:  # transformers' rule: every integration that is installed
        from transformers.integrations import get_available_reporting_integrations

        return {"logging.report_to": [t for t in get_available_reporting_integrations() if t in TRACKERS]}
    return {"logging.report_to": [v] if isinstance(v, str) else list(v)}


def model_init_kwargs(v, _):
    """model_init_kwargs: the loading arguments this project's loader has; any other is refused by name."""
    out: dict[str, Any] = {}
    for key, value in (v or {}).items():
        if key in ("dtype", "torch_dtype"):
            value = str(value).removeprefix("torch.")
            out["model.dtype"] = {"float": "float32", "half": "float16", "bfloat16": "bfloat16"}.get(value, value)
        elif key == "attn_implementation":
            out["model.attn_implementation"] = value
        elif key == "device_map":
            if value not in (None, "auto") and not isinstance(value, str):
                raise SettingError("model_init_kwargs", f"device_map={value!r}: the policy is placed whole on one "
                                   "device here; give a device ('cpu', 'cuda:0') or 'auto'")
            out["model.device"] = None if value in (None, "auto") else value
        elif key == "revision":
            if value not in (None, "main"):
                raise SettingError("model_init_kwargs", f"revision={value!r}: download that revision first "
                                   "(huggingface_hub.snapshot_download) and give its local path as the model")
        elif key == "trust_remote_code":
            raise SettingError("model_init_kwargs", "trust_remote_code inside model_init_kwargs: give "
                               "trust_remote_code=True to GRPOConfig itself (an explicit argument, as the trust rules "
                               "ask)")
        else:
            raise SettingError("model_init_kwargs", f"{key}={value!r} has no same-meaning loading setting here "
                               "(dtype, attn_implementation, device_map, revision)")
    return out


def generation_kwargs(v, _):
    """generation_kwargs: what our generation section holds goes there (TRL: they win over the other fields); the
    rest is set on the model's generation config."""
    ours = {"temperature": "generation.temperature", "top_p": "generation.top_p", "top_k": "generation.top_k",
            "min_p": "generation.min_p", "repetition_penalty": "generation.repetition_penalty",
            "max_new_tokens": "generation.max_new_tokens", "cache_implementation": "generation.cache_implementation"}
    v = dict(v or {})
    out = {ours[k]: v.pop(k) for k in list(v) if k in ours}
    return {**out, "generation.generation_kwargs": v}


def fsdp(v, _):
    if not v:
        return {}
    return {"fsdp": " ".join(v) if isinstance(v, (list, tuple)) else str(v)}


def mixed(name: str, other: str):
    """bf16 / fp16: True asks for that precision; False only means "not this one" (the other may ask for its own)."""
    return lambda v, given: {name: True} if v else ({name: False} if v is False and not given.get(other) else {})


def save_strategy(v, given):
    v = getattr(v, "value", v)
    if v == "no":
        return {"logging.save_every": 0, "logging.checkpoint_at_end": False}
    if v == "epoch":
        return {"trl.save_strategy": "epoch", "logging.checkpoint_at_end": True}
    if v == "best":
        raise SettingError("save_strategy", "'best' picks checkpoints by an evaluation metric "
                           "(metric_for_best_model), which is not tracked here: use 'steps' or 'epoch'")
    return {"logging.save_every": steps_value(given.get("save_steps", 500), given, "save_steps"),
            "logging.checkpoint_at_end": True}


def steps_value(v, given, name):
    """A steps field as transformers reads it: a float below 1 is a share of max_steps."""
    if isinstance(v, float) and 0 < v < 1:
        steps = given.get("max_steps", -1)
        if not steps or steps <= 0:
            raise SettingError(name, f"{v} is a share of max_steps: give max_steps, or {name} as a step count")
        return math.ceil(steps * v)
    return int(v)


def log_level(v, _):
    return {"trl.log_level": v}


def fp32_head(v, given):
    half = given.get("bf16") or given.get("fp16") or str((given.get("model_init_kwargs") or {}).get(
        "dtype", "")).removeprefix("torch.") in ("bfloat16", "float16", "half")
    if v and half:
        raise SettingError("cast_lm_head_to_fp32", "the LM head runs in the policy's half precision here (its "
                           "logits are upcast after the matmul): train in float32 for an fp32 head")
    return {}


def vllm(v, _):
    if v:
        raise SettingError("use_vllm", VLLM)
    return {}
