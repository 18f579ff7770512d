"""Every field of TRL's `GRPOConfig`, classified once: what a TRL script's value means here.

- honoured: taken with TRL's meaning, into the setting named (a translation where the two count differently, e.g.
  TRL's per_device_train_batch_size counts completions, data.batch_size prompts);
- no effect: accepted; a value other than TRL's default warns once, saying why it changes nothing here (DeepSpeed,
  TPU, hub tokens, logging-only knobs). Only fields whose value cannot change a run's results;
- refused: a value other than TRL's default cannot be honoured and ignoring it would change results: one line naming
  what to use instead, all such fields in one error.

TRL's own default value of any field is always accepted. `translate(given)` turns a GRPOConfig's keywords into this
project's settings plus the API's TRL schedule (logging, evaluation and epoch-based saving, which the trainer keeps,
api/schedule.py). `make trl-fields-doc` (or `python -m vlm_grpo.api.trl_fields`) writes docs/trl-grpoconfig-fields.md from this table and the
installed TRL; tests/api/test_trl_fields.py fails when the installed TRL has a field this table does not classify.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vlm_grpo.grpo.settings.fields import SettingError

HONOURED, NO_EFFECT, REFUSED = "honoured", "no effect", "refused"
VLLM = "vLLM rollouts: see issue/README"
DOC = Path(__file__).resolve().parents[2] / "docs" / "trl-grpoconfig-fields.md"


@dataclass(frozen=True)
class Rule:
    status: str
    setting: str = ""  # our setting(s) it becomes (docs), or "" for none
    note: str = ""
    # value, all given keywords -> our settings ({dotted key: value}); None: passed on under `setting` as it is
    to: Callable[[Any, dict], dict] | None = None


def _honour(setting: str, note: str = "", to=None) -> Rule:
    return Rule(HONOURED, setting, note, to)


def _none(note: str) -> Rule:
    return Rule(NO_EFFECT, "", note)


def _refuse(note: str, setting: str = "") -> Rule:
    return Rule(REFUSED, setting, note)


def _same(key: str) -> Callable[[Any, dict], dict]:
    """The value as it is, under our key; None (TRL's "unset") leaves our default."""
    return lambda v, _: {} if v is None else {key: v}


def _dict_or_empty(key: str) -> Callable[[Any, dict], dict]:
    return lambda v, _: {key: dict(v or {})}


def _schedule(name: str) -> Callable[[Any, dict], dict]:
    """A field the API's trainer schedule reads (logging, evaluation moments); kept under `trl.NAME`."""
    return lambda v, _: {f"trl.{name}": v}


# ------------------------------------------------------------------ translations that need more than one field
def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


BATCH_FIELDS = ("per_device_train_batch_size", "generation_batch_size", "steps_per_generation")


def _batch(given: dict) -> dict:
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
    n = _world_size()
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
    if spg != accumulation:
        raise SettingError("steps_per_generation", f"{spg} (a generation spread over several optimizer steps) differs "
                           f"from gradient_accumulation_steps ({accumulation}): here each optimizer step samples its "
                           "own generation; to reuse one generation for several updates set num_iterations")
    completions = per_device * spg
    if completions % g:
        raise SettingError("per_device_train_batch_size", f"{per_device} x steps_per_generation {spg} = {completions} "
                           f"completions per process is not whole groups of num_generations ({g})")
    prompts = completions // g
    # micro-batches hold whole prompt groups: as many as divide the prompts (the update is the same, memory differs)
    return {"data.batch_size": prompts, "data.num_generations": g,
            "gradient_accumulation_steps": math.gcd(prompts, accumulation)}


def _length(given: dict) -> dict:
    """TRL: max_steps > 0 wins; else num_train_epochs (default 3.0) passes over the training split."""
    steps = given.get("max_steps", -1)
    if steps is not None and steps > 0:
        return {"max_steps": steps, "epochs": 0.0}
    epochs = given.get("num_train_epochs", 3.0)
    if not epochs or epochs <= 0:
        raise SettingError("num_train_epochs", f"{epochs!r}: with max_steps={steps} the run length comes from "
                           "num_train_epochs, which must be > 0")
    return {"epochs": float(epochs)}


def _betas(given: dict) -> dict:
    return {"optim.adam_betas": [given.get("adam_beta1", 0.9), given.get("adam_beta2", 0.999)]}


def _warmup(v, _):
    if v is None or v == 0:
        return {"optim.warmup_steps": 0}
    if isinstance(v, float) and 0 < v < 1:  # transformers: a float below 1 is a share of the run's steps
        return {"optim.warmup_ratio": v}
    return {"optim.warmup_steps": int(v)}


def _report_to(v, _):
    from vlm_grpo.grpo.settings.sections import TRACKERS

    if v is None or v == "none" or v == ["none"]:
        return {"logging.report_to": []}
    if v == "all" or v == ["all"]:  # transformers' rule: every integration that is installed
        from transformers.integrations import get_available_reporting_integrations

        return {"logging.report_to": [t for t in get_available_reporting_integrations() if t in TRACKERS]}
    return {"logging.report_to": [v] if isinstance(v, str) else list(v)}


def _model_init_kwargs(v, _):
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


def _generation_kwargs(v, _):
    """generation_kwargs: what our generation section holds goes there (TRL: they win over the other fields); the
    rest is set on the model's generation config."""
    ours = {"temperature": "generation.temperature", "top_p": "generation.top_p", "top_k": "generation.top_k",
            "min_p": "generation.min_p", "repetition_penalty": "generation.repetition_penalty",
            "max_new_tokens": "generation.max_new_tokens", "cache_implementation": "generation.cache_implementation"}
    v = dict(v or {})
    out = {ours[k]: v.pop(k) for k in list(v) if k in ours}
    return {**out, "generation.generation_kwargs": v}


def _fsdp(v, _):
    if not v:
        return {}
    return {"fsdp": " ".join(v) if isinstance(v, (list, tuple)) else str(v)}


def _mixed(name: str, other: str):
    """bf16 / fp16: True asks for that precision; False only means "not this one" (the other may ask for its own)."""
    return lambda v, given: {name: True} if v else ({name: False} if v is False and not given.get(other) else {})


def _save_strategy(v, given):
    v = getattr(v, "value", v)
    if v == "no":
        return {"logging.save_every": 0, "logging.checkpoint_at_end": False}
    if v == "epoch":
        return {"trl.save_strategy": "epoch", "logging.checkpoint_at_end": True}
    if v == "best":
        raise SettingError("save_strategy", "'best' picks checkpoints by an evaluation metric "
                           "(metric_for_best_model), which is not tracked here: use 'steps' or 'epoch'")
    return {"logging.save_every": _steps_value(given.get("save_steps", 500), given, "save_steps"),
            "logging.checkpoint_at_end": True}


def _steps_value(v, given, name):
    """A steps field as transformers reads it: a float below 1 is a share of max_steps."""
    if isinstance(v, float) and 0 < v < 1:
        steps = given.get("max_steps", -1)
        if not steps or steps <= 0:
            raise SettingError(name, f"{v} is a share of max_steps: give max_steps, or {name} as a step count")
        return math.ceil(steps * v)
    return int(v)


def _log_level(v, _):
    return {"trl.log_level": v}


def _fp32_head(v, given):
    half = given.get("bf16") or given.get("fp16") or str((given.get("model_init_kwargs") or {}).get(
        "dtype", "")).removeprefix("torch.") in ("bfloat16", "float16", "half")
    if v and half:
        raise SettingError("cast_lm_head_to_fp32", "the LM head runs in the policy's half precision here (its "
                           "logits are upcast after the matmul): train in float32 for an fp32 head")
    return {}


def _vllm(v, _):
    if v:
        raise SettingError("use_vllm", VLLM)
    return {}


# ------------------------------------------------------------------ the table: every field of TRL 1.16's GRPOConfig
LOG_ONLY = "changes what is printed or logged, not the run"
NOT_IN_GRPO = "TRL's GRPOTrainer does not use it either (it computes its own loss and batches)"
LAUNCHER = "multi-process settings come from `accelerate launch` here; its value changes no result"
HUB_OFFLINE = "hub pushes use huggingface_hub's login (no token in the settings); offline here"
VLLM_ONLY = "used only with use_vllm=True (" + VLLM + ")"

RULES: dict[str, Rule] = {
    # ------------------------------------------------ the run's length, batch and optimizer
    "output_dir": _honour("logging.output_dir", "None: runs/latest", _same("logging.output_dir")),
    "per_device_train_batch_size": _honour("data.batch_size, gradient_accumulation_steps",
                                           "TRL counts completions: data.batch_size = per_device_train_batch_size x "
                                           "steps_per_generation / num_generations prompts per process"),
    "num_train_epochs": _honour("epochs", "used when max_steps <= 0, as in TRL: ceil(epochs x rows // prompts per "
                                "step) steps"),
    "max_steps": _honour("max_steps / epochs", "-1: the length comes from num_train_epochs"),
    "learning_rate": _honour("optim.learning_rate"),
    "lr_scheduler_type": _honour("optim.lr_scheduler", "any name transformers.get_scheduler knows",
                                 lambda v, _: {"optim.lr_scheduler": getattr(v, "value", v)}),
    "lr_scheduler_kwargs": _honour("optim.lr_scheduler_kwargs", "get_scheduler's scheduler_specific_kwargs",
                                   _dict_or_empty("optim.lr_scheduler_kwargs")),
    "warmup_steps": _honour("optim.warmup_steps / optim.warmup_ratio", "a float below 1 is a share of the run's "
                            "steps (transformers)", _warmup),
    "optim": _honour("optim.optimizer", "adamw_torch, adamw_torch_fused, adafactor, sgd, adamw_bnb_8bit, "
                     "paged_adamw_8bit, built by transformers' Trainer.get_optimizer_cls_and_kwargs",
                     lambda v, _: {"optim.optimizer": getattr(v, "value", v)}),
    "optim_args": _refuse("optimizer arguments beyond adam_beta1/2, adam_epsilon and weight_decay are not passed on"),
    "weight_decay": _honour("optim.weight_decay", "applied to every trainable parameter of the group (transformers' "
                            "Trainer skips biases and norms)"),
    "adam_beta1": _honour("optim.adam_betas"),
    "adam_beta2": _honour("optim.adam_betas"),
    "adam_epsilon": _honour("optim.adam_eps"),
    "optim_target_modules": _refuse("GaLore/APOLLO-style optimizers are not built here; choose one of "
                                    "optim.optimizer's names"),
    "gradient_accumulation_steps": _honour("gradient_accumulation_steps", "micro-batches per update, each whole "
                                           "prompt groups (the count that divides the prompts)"),
    "average_tokens_across_devices": _refuse("the loss is always normalised by the tokens of all processes here",
                                             "loss"),
    "max_grad_norm": _honour("optim.max_grad_norm"),
    "label_smoothing_factor": _none(NOT_IN_GRPO),
    # ------------------------------------------------ precision and speed
    "bf16": _honour("mixed_precision", "True: bf16 autocast", _mixed("bf16", "fp16")),
    "fp16": _honour("mixed_precision", "True: fp16 autocast with a loss scaler", _mixed("fp16", "bf16")),
    "bf16_full_eval": _refuse("evaluation runs in the run's own precision (mixed_precision)"),
    "fp16_full_eval": _refuse("evaluation runs in the run's own precision (mixed_precision)"),
    "tf32": _honour("(torch.backends)", "set on torch's matmul/cuDNN switches when the trainer is made, as "
                    "transformers does", _schedule("tf32")),
    "activation_checkpointing": _honour("perf.gradient_checkpointing", "transformers' new name of "
                                        "gradient_checkpointing", _same("perf.gradient_checkpointing")),
    "activation_checkpointing_kwargs": _honour("perf.gradient_checkpointing_kwargs", "",
                                               _dict_or_empty("perf.gradient_checkpointing_kwargs")),
    "gradient_checkpointing": _honour("perf.gradient_checkpointing"),
    "gradient_checkpointing_kwargs": _honour("perf.gradient_checkpointing_kwargs", "torch.utils.checkpoint's "
                                             "arguments (default use_reentrant=False)",
                                             _dict_or_empty("perf.gradient_checkpointing_kwargs")),
    "torch_compile": _none("the policy runs eagerly here; compiling changes speed, not what is computed"),
    "torch_compile_backend": _none("see torch_compile"),
    "torch_compile_mode": _none("see torch_compile"),
    "use_liger_kernel": _refuse("liger-kernel's fused GRPO loss is not wired in (it needs a GPU and the package); "
                                "the LM head is already scored chunk by chunk (perf.logprob_chunk_mb)"),
    "liger_kernel_config": _none("see use_liger_kernel"),
    "use_cache": _none("generation decides its KV cache by model.cache_policy; training forwards keep none"),
    "neftune_noise_alpha": _refuse("NEFTune embedding noise is not applied here"),
    "torch_empty_cache_steps": _none("memory housekeeping only"),
    "auto_find_batch_size": _refuse("TRL refuses it too: lower per_device_train_batch_size instead"),
    # ------------------------------------------------ logging
    "logging_strategy": _honour("(trainer schedule), logging.log_every", "steps / epoch / no: which steps reach "
                                "on_log, state.log_history and the trackers (metrics.jsonl keeps every step)",
                                _schedule("logging_strategy")),
    "logging_steps": _honour("(trainer schedule), logging.log_every", "a float below 1 is a share of max_steps",
                             _schedule("logging_steps")),
    "logging_first_step": _honour("(trainer schedule)", "", _schedule("logging_first_step")),
    "log_on_each_node": _none(LAUNCHER),
    "logging_nan_inf_filter": _none(LOG_ONLY),
    "include_num_input_tokens_seen": _none(LOG_ONLY + "; metrics.jsonl counts prefill and decode tokens"),
    "log_level": _honour("(logging levels)", "vlm_grpo's and transformers' loggers, when the trainer is made",
                         _log_level),
    "log_level_replica": _none(LAUNCHER),
    "disable_tqdm": _honour("logging.progress", "", lambda v, _: {} if v is None else {"logging.progress": not v}),
    "report_to": _honour("logging.report_to", "'none', 'all' (the installed trackers this project runs) or names",
                         _report_to),
    "run_name": _honour("logging.run_name"),
    "project": _none("the trackers' project is vlm-grpo here; " + LOG_ONLY),
    "trackio_space_id": _none("trackio (issue 40); " + LOG_ONLY),
    "trackio_bucket_id": _none("trackio (issue 40); " + LOG_ONLY),
    "trackio_static_space_id": _none("trackio (issue 40); " + LOG_ONLY),
    # ------------------------------------------------ evaluation
    "eval_strategy": _honour("(trainer schedule)", "no / steps / epoch: greedy held-out evaluation at those steps "
                             "(and at the end for steps, as transformers does)", _schedule("eval_strategy")),
    "eval_steps": _honour("(trainer schedule)", "None: logging_steps", _schedule("eval_steps")),
    "eval_delay": _honour("(trainer schedule)", "", _schedule("eval_delay")),
    "per_device_eval_batch_size": _honour("eval.eval_batch_size", "TRL counts completions: prompts per generate() "
                                          "call = per_device_eval_batch_size / num_generations_eval",
                                          lambda v, g: {"eval.eval_batch_size": max(
                                              1, v // (g.get("num_generations_eval") or g.get("num_generations") or 1))}),
    "prediction_loss_only": _none(NOT_IN_GRPO),
    "eval_on_start": _honour("(trainer schedule)", "", _schedule("eval_on_start")),
    "eval_do_concat_batches": _none(NOT_IN_GRPO),
    "eval_use_gather_object": _none(NOT_IN_GRPO),
    "eval_accumulation_steps": _none(NOT_IN_GRPO),
    "include_for_metrics": _none(NOT_IN_GRPO),
    "batch_eval_metrics": _none(NOT_IN_GRPO),
    "num_generations_eval": _refuse("held-out evaluation here is greedy, one answer per prompt (accuracy and "
                                    "rewards of that answer)"),
    # ------------------------------------------------ saving and the hub
    "save_only_model": _none("checkpoints always hold the optimizer and RNG state too (resume needs them); "
                             "the model files are the same"),
    "save_strategy": _honour("logging.save_every, logging.checkpoint_at_end", "steps / epoch / no (best is "
                             "refused: it needs metric_for_best_model)", _save_strategy),
    "save_steps": _honour("logging.save_every", "a float below 1 is a share of max_steps"),
    "save_on_each_node": _none(LAUNCHER),
    "save_total_limit": _honour("logging.keep_checkpoints", "None: all kept",
                                lambda v, _: {"logging.keep_checkpoints": v or 0}),
    "enable_jit_checkpoint": _none("SIGTERM/SIGINT always save the step here"),
    "push_to_hub": _honour("logging.push_to_hub", "pushes final/ with its model card at the end"),
    "hub_token": _none(HUB_OFFLINE),
    "hub_private_repo": _honour("logging.hub_private", "", _same("logging.hub_private")),
    "hub_model_id": _honour("logging.hub_model_id"),
    "hub_strategy": _none("final/ is pushed once, at the end; " + HUB_OFFLINE),
    "hub_always_push": _none(HUB_OFFLINE),
    "hub_revision": _refuse("pushes go to the repository's main branch"),
    "load_best_model_at_end": _refuse("the final model is the last step's; pick a checkpoint-N yourself"),
    "metric_for_best_model": _refuse("see load_best_model_at_end"),
    "greater_is_better": _refuse("see load_best_model_at_end"),
    "ignore_data_skip": _none("a resumed run's data order is a pure function of the step: nothing is skipped"),
    "restore_callback_states_from_checkpoint": _none("callbacks keep no state in checkpoints here"),
    "resume_from_checkpoint": _honour("resume / resume_from", "True: the newest checkpoint; a path: that one"),
    # ------------------------------------------------ seeds, data, processes
    "full_determinism": _honour("perf.full_determinism", "transformers.enable_full_determinism"),
    "seed": _honour("seed"),
    "data_seed": _honour("data.data_seed", "seed of the training data order (None: seed)"),
    "use_cpu": _honour("model.device", "", lambda v, _: {"model.device": "cpu"} if v else {}),
    "accelerator_config": _refuse("configure accelerate with `accelerate launch` / `accelerate config`"),
    "parallelism_config": _refuse("tensor/context parallelism is not supported; FSDP: fsdp"),
    "dataloader_drop_last": _none("no dataloader here: steps draw whole prompt batches (TRL's sampler drops a "
                                  "partial one too)"),
    "dataloader_num_workers": _none("no dataloader here: rows are read in the main process"),
    "dataloader_pin_memory": _none("no dataloader here"),
    "dataloader_persistent_workers": _none("no dataloader here"),
    "dataloader_prefetch_factor": _none("no dataloader here"),
    "dataloader_multiprocessing_context": _none("no dataloader here"),
    "dataloader_in_order": _none("no dataloader here"),
    "remove_unused_columns": _none("rewards receive every column here; TRL's True would only drop columns they "
                                   "do not read"),
    "label_names": _none(NOT_IN_GRPO),
    "train_sampling_strategy": _none(NOT_IN_GRPO + " (its RepeatSampler); use shuffle_dataset"),
    "length_column_name": _none(NOT_IN_GRPO),
    "ddp_find_unused_parameters": _none(LAUNCHER),
    "ddp_bucket_cap_mb": _none(LAUNCHER),
    "ddp_broadcast_buffers": _none(LAUNCHER),
    "ddp_static_graph": _none(LAUNCHER),
    "ddp_backend": _none(LAUNCHER),
    "ddp_timeout": _none(LAUNCHER),
    "fsdp": _honour("fsdp", "full_shard / shard_grad_op (FSDP2)", _fsdp),
    "fsdp_config": _refuse("FSDP options come from fsdp and `accelerate launch --use_fsdp`"),
    "deepspeed": _none("DeepSpeed is configured by `accelerate launch --use_deepspeed` here, not by this field"),
    "debug": _none("TPU/underflow debugging only"),
    "skip_memory_metrics": _none(LOG_ONLY),
    "do_train": _none("a script flag; TRL's trainer ignores it too"),
    "do_eval": _none("a script flag; TRL's trainer ignores it too"),
    "do_predict": _none("a script flag; TRL's trainer ignores it too"),
    "local_rank": _none(LAUNCHER),
    # ------------------------------------------------ model
    "model_init_kwargs": _honour("model.dtype, model.attn_implementation, model.device", "dtype, "
                                 "attn_implementation, device_map, revision ('main'); trust_remote_code only as its "
                                 "own argument", _model_init_kwargs),
    "trust_remote_code": _honour("model.trust_remote_code"),
    "router_aux_loss_coef": _honour("loss.router_aux_loss_coef"),
    "disable_dropout": _honour("(always)", "the policy always runs without dropout here (the ratio compares like with "
                               "like); False, TRL's default, is accepted", lambda v, _: {}),
    "cast_lm_head_to_fp32": Rule(REFUSED, "", "with an fp32 policy the head already runs in fp32 (accepted); with "
                                 "bf16/fp16 the head's matmul runs in half precision and its logits are upcast after: "
                                 "train in float32 (mixed_precision no) for an fp32 head", _fp32_head),
    # ------------------------------------------------ generation
    "num_generations": _honour("data.num_generations"),
    "max_completion_length": _honour("generation.max_new_tokens"),
    "ds3_gather_for_generation": _none("DeepSpeed ZeRO-3 only; under FSDP the full weights are gathered for "
                                       "generation"),
    "shuffle_dataset": _honour("data.shuffle"),
    "pad_to_multiple_of": _none("padding only"),
    "generation_batch_size": _honour("data.batch_size", "completions per generation, all processes"),
    "steps_per_generation": _honour("data.batch_size", "must equal gradient_accumulation_steps (one generation per "
                                    "optimizer step); num_iterations reuses a generation"),
    "temperature": _honour("generation.temperature"),
    "top_p": _honour("generation.top_p"),
    "top_k": _honour("generation.top_k", "", lambda v, _: {"generation.top_k": v or 0}),
    "min_p": _honour("generation.min_p"),
    "generation_kwargs": _honour("generation.generation_kwargs", "sampling fields go to their settings, the rest "
                                 "onto the model's generation config", _generation_kwargs),
    "chat_template_kwargs": _honour("data.chat_template_kwargs", "", _dict_or_empty("data.chat_template_kwargs")),
    "repetition_penalty": _honour("generation.repetition_penalty"),
    "cache_implementation": _honour("generation.cache_implementation"),
    "use_vllm": Rule(REFUSED, "", VLLM, _vllm),
    "use_transformers_continuous_batching": _none("rollouts share each prompt's prefill here (perf.shared_prefix); "
                                                  "batching changes speed, not samples' distribution"),
    "transformers_continuous_batching_config": _none("see use_transformers_continuous_batching"),
    "use_transformers_paged": _none("see use_transformers_continuous_batching"),
    "max_tool_calling_iterations": _honour("tools.max_tool_calling_iterations"),
    # ------------------------------------------------ the loss
    "beta": _honour("loss.beta"),
    "num_iterations": _honour("num_iterations", "updates per generation; note max_steps counts generations here "
                              "(TRL counts updates)"),
    "epsilon": _honour("loss.epsilon"),
    "delta": _honour("loss.delta"),
    "epsilon_high": _honour("loss.epsilon_high"),
    "sapo_temperature_neg": _honour("loss.sapo_temperature_neg"),
    "sapo_temperature_pos": _honour("loss.sapo_temperature_pos"),
    "vespo_k_pos": _honour("loss.vespo_k_pos"),
    "vespo_lambda_pos": _honour("loss.vespo_lambda_pos"),
    "vespo_k_neg": _honour("loss.vespo_k_neg"),
    "vespo_lambda_neg": _honour("loss.vespo_lambda_neg"),
    "importance_sampling_level": _honour("loss.importance_sampling_level"),
    "reward_weights": _honour("data.reward_weights", "None: each reward's own weight",
                              lambda v, _: {"data.reward_weights": list(v or [])}),
    "multi_objective_aggregation": _honour("multi_objective_aggregation"),
    "scale_rewards": _honour("scale_rewards"),
    "loss_type": _honour("loss.loss_type"),
    "mask_truncated_completions": _honour("loss.mask_truncated_completions"),
    "sync_ref_model": _honour("loss.sync_ref_model"),
    "ref_model_mixup_alpha": _honour("loss.ref_model_mixup_alpha"),
    "ref_model_sync_steps": _honour("loss.ref_model_sync_steps"),
    "top_entropy_quantile": _honour("loss.top_entropy_quantile"),
    "entropy_coef": _honour("loss.entropy_coef"),
    "use_adaptive_entropy": _honour("loss.use_adaptive_entropy"),
    "entropy_coef_min": _honour("loss.entropy_coef_min"),
    "entropy_coef_max": _honour("loss.entropy_coef_max"),
    "entropy_coef_delta": _honour("loss.entropy_coef_delta"),
    "entropy_target": _honour("loss.entropy_target"),
    "off_policy_mask_threshold": _honour("loss.off_policy_mask_threshold"),
    "use_bias_correction_kl": _honour("loss.use_bias_correction_kl"),
    # ------------------------------------------------ completions logging (issue 40 owns their output)
    "log_completions": _honour("logging.log_completions", "completions.jsonl (every completion with its rewards)"),
    "log_multimodal": _none(LOG_ONLY),
    "num_completions_to_print": _none(LOG_ONLY + "; completions.jsonl holds every completion"),
    "log_unique_prompts": _none(LOG_ONLY),
    "log_completions_hub_repo": _none(HUB_OFFLINE),
}
for _name in ("vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
              "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
              "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
              "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
              "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap"):
    RULES[_name] = _none(VLLM_ONLY)

# fields translated together (one field's meaning depends on the others)
JOINT = {"adam_beta1": _betas, "adam_beta2": _betas, "num_train_epochs": _length, "max_steps": _length}


# ------------------------------------------------------------------ reading the installed TRL
@functools.cache
def trl_defaults() -> dict[str, Any]:
    """Each field of the installed TRL's GRPOConfig with its default (without TRL: TrainingArguments')."""
    try:
        from trl import GRPOConfig as config_class
    except ImportError:  # without TRL: the fields it inherits from transformers' TrainingArguments
        from transformers import TrainingArguments as config_class
    out = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def is_default(name: str, value: Any, defaults: dict[str, Any]) -> bool:
    if name not in defaults:
        return False
    return _plain(value) == _plain(defaults[name])


# ------------------------------------------------------------------ translating a GRPOConfig's keywords
def translate(given: dict[str, Any]) -> dict[str, Any]:
    """The keywords of a GRPOConfig as this project's settings (dotted keys; `trl.*` for the trainer's schedule).
    Keywords that are not TRL fields pass through; TRL fields are translated by RULES. A no-effect field given another
    value than TRL's default warns once; refused fields with other values are refused together in one error."""
    defaults = trl_defaults()
    given = {k: _plain(v) for k, v in given.items()}
    out: dict[str, Any] = {}
    refused: list[tuple[str, str]] = []
    for name, value in given.items():
        rule = RULES.get(name)
        if rule is None:
            out[name] = value
            continue
        if rule.status == REFUSED:
            if rule.to is not None:
                try:
                    rule.to(value, given)
                except SettingError as err:
                    refused.append((name, err.problem))
            elif not is_default(name, value, defaults) and value not in (None, False):
                refused.append((name, f"{value!r} cannot be honoured here: {rule.note}"))
            continue
        if rule.status == NO_EFFECT:
            if not is_default(name, value, defaults) and value is not None:
                warnings.warn(f"GRPOConfig: {name}={value!r} has no effect here: {rule.note}", UserWarning,
                              stacklevel=3)
            continue
        if name in BATCH_FIELDS:
            continue  # translated together below
        if name in JOINT:
            out.update(JOINT[name](given))
        elif rule.to is not None:
            out.update(rule.to(value, given))
        elif name == "save_steps" and "save_strategy" in given:
            continue  # the strategy decides
        elif name == "save_steps":
            out["logging.save_every"] = _steps_value(value, given, name)
        else:
            out[name] = value  # the same name and meaning here: the settings parser takes it
    if len(refused) == 1:
        raise SettingError(*refused[0])
    if refused:
        raise SettingError(", ".join(name for name, _ in refused), "; ".join(f"{n}: {p}" for n, p in refused))
    if any(name in given for name in BATCH_FIELDS):
        out.update(_batch(given))
    if given.get("logging_strategy", "steps") == "steps" and isinstance(given.get("logging_steps"), int):
        out["logging.log_every"] = given["logging_steps"]  # the trackers get TRL's logged steps
    return out


# ------------------------------------------------------------------ the docs page
def table_markdown() -> str:
    """docs/trl-grpoconfig-fields.md: one row per field of the installed TRL's GRPOConfig."""
    import trl

    defaults = trl_defaults()
    counts = {s: sum(RULES[n].status == s for n in defaults if n in RULES) for s in (HONOURED, NO_EFFECT, REFUSED)}
    lines = [
        "# TRL's GRPOConfig fields in vlm-grpo",
        "",
        f"Generated by `make trl-fields-doc` from TRL {trl.__version__}'s `GRPOConfig` "
        f"({len(defaults)} fields: {counts[HONOURED]} honoured, {counts[NO_EFFECT]} accepted without effect, "
        f"{counts[REFUSED]} refused when set). Do not edit by hand.",
        "",
        "- **honoured**: taken with TRL's meaning, as the setting named.",
        "- **no effect**: accepted; a value other than TRL's default warns once, saying why it changes nothing here.",
        "- **refused**: a value other than TRL's default cannot be honoured and ignoring it would change the run: it "
        "is refused in one line naming what to use instead. TRL's default is always accepted.",
        "",
        "| field | TRL default | status | our setting | note |",
        "|---|---|---|---|---|",
    ]
    for name, default in defaults.items():
        rule = RULES.get(name, Rule("UNCLASSIFIED"))
        cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines.append(f"| `{name}` | `{cell(repr(_plain(default)))}` | {rule.status} | {cell(rule.setting)} | "
                     f"{cell(rule.note)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    DOC.write_text(table_markdown(), encoding="utf-8")
    print(f"wrote {DOC}")
