"""Every field of TRL's `GRPOConfig`, classified once: what a TRL script's value means here.

- honoured: taken with TRL's meaning, into the setting named (a translation where the two count differently, e.g.
  TRL's per_device_train_batch_size counts completions, data.batch_size prompts);
- no effect: accepted; a value other than TRL's default warns once, saying why it changes nothing here (DeepSpeed,
  TPU, hub tokens, logging-only knobs). Only fields whose value cannot change a run's results;
- refused: a value other than TRL's default cannot be honoured and ignoring it would change results: one line naming
  what to use instead, all such fields in one error.

TRL's own default value of any field is always accepted. `translate(given)` turns a GRPOConfig's keywords into this
project's settings plus the API's TRL schedule (logging, evaluation and epoch-based saving, which the trainer keeps,
api/schedule.py). `make trl-fields-doc` (api/trl_fields_doc.py) writes docs/trl-grpoconfig-fields.md from this table and the
installed TRL; tests/api/test_trl_fields.py fails when the installed TRL has a field this table does not classify.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from vlm_grpo.api import trl_translations as tr
from vlm_grpo.api.trl_translations import VLLM
from vlm_grpo.grpo.setting_fields import SettingError

HONOURED, NO_EFFECT, REFUSED = "honoured", "no effect", "refused"


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


LIGER = ("liger-kernel's fused GRPO loss is not wired in (it needs a GPU and the package, and reads lm_head.weight "
         "directly); the LM head (lm_head) is already scored chunk by chunk here (perf.logprob_chunk_mb): leave "
         "use_liger_kernel False. Refused when the trainer is built, as TRL checks its Liger options there")

# ------------------------------------------------------------------ the table: every field of TRL 1.16's GRPOConfig
LOG_ONLY = "changes what is printed or logged, not the run"
NOT_IN_GRPO = "TRL's GRPOTrainer does not use it either (it computes its own loss and batches)"
LAUNCHER = "multi-process settings come from `accelerate launch` here; its value changes no result"
HUB_OFFLINE = "hub pushes use huggingface_hub's login (no token in the settings); offline here"
VLLM_ONLY = "used only with use_vllm=True (" + VLLM + ")"

RULES: dict[str, Rule] = {
    # ------------------------------------------------ the run's length, batch and optimizer
    "output_dir": _honour("logging.output_dir", "None: runs/latest", tr.same("logging.output_dir")),
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
                                   tr.dict_or_empty("optim.lr_scheduler_kwargs")),
    "warmup_steps": _honour("optim.warmup_steps / optim.warmup_ratio", "a float below 1 is a share of the run's "
                            "steps (transformers)", tr.warmup),
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
    "bf16": _honour("mixed_precision", "True: weights stored in bf16, fp32 master weights in the optimizer", tr.mixed("bf16", "fp16")),
    "fp16": _honour("mixed_precision", "True: fp16 autocast with a loss scaler", tr.mixed("fp16", "bf16")),
    "bf16_full_eval": _refuse("evaluation runs in the run's own precision (mixed_precision)"),
    "fp16_full_eval": _refuse("evaluation runs in the run's own precision (mixed_precision)"),
    "tf32": _honour("(torch.backends)", "set on torch's matmul/cuDNN switches when the trainer is made, as "
                    "transformers does", tr.schedule("tf32")),
    "activation_checkpointing": _honour("perf.gradient_checkpointing", "transformers' new name of "
                                        "gradient_checkpointing", tr.same("perf.gradient_checkpointing")),
    "activation_checkpointing_kwargs": _honour("perf.gradient_checkpointing_kwargs", "",
                                               tr.dict_or_empty("perf.gradient_checkpointing_kwargs")),
    "gradient_checkpointing": _honour("perf.gradient_checkpointing"),
    "gradient_checkpointing_kwargs": _honour("perf.gradient_checkpointing_kwargs", "torch.utils.checkpoint's "
                                             "arguments (default use_reentrant=False)",
                                             tr.dict_or_empty("perf.gradient_checkpointing_kwargs")),
    "torch_compile": _none("the policy runs eagerly here; compiling changes speed, not what is computed"),
    "torch_compile_backend": _none("see torch_compile"),
    "torch_compile_mode": _none("see torch_compile"),
    "use_liger_kernel": Rule(REFUSED, "", LIGER, tr.schedule("use_liger_kernel")),
    "liger_kernel_config": _none("see use_liger_kernel"),
    "use_cache": _none("generation decides its KV cache by model.cache_policy; training forwards keep none"),
    "neftune_noise_alpha": _refuse("NEFTune embedding noise is not applied here"),
    "torch_empty_cache_steps": _none("memory housekeeping only"),
    "auto_find_batch_size": _refuse("TRL refuses it too: lower per_device_train_batch_size instead"),
    # ------------------------------------------------ logging
    "logging_strategy": _honour("(trainer schedule), logging.log_every", "steps / epoch / no: which steps reach "
                                "on_log, state.log_history and the trackers (metrics.jsonl keeps every step)",
                                tr.schedule("logging_strategy")),
    "logging_steps": _honour("(trainer schedule), logging.log_every", "a float below 1 is a share of max_steps",
                             tr.schedule("logging_steps")),
    "logging_first_step": _honour("(trainer schedule)", "", tr.schedule("logging_first_step")),
    "log_on_each_node": _none(LAUNCHER),
    "logging_nan_inf_filter": _none(LOG_ONLY),
    "include_num_input_tokens_seen": _none(LOG_ONLY + "; metrics.jsonl counts prefill and decode tokens"),
    "log_level": _honour("(logging levels)", "vlm_grpo's and transformers' loggers, when the trainer is made",
                         tr.log_level),
    "log_level_replica": _none(LAUNCHER),
    "disable_tqdm": _honour("logging.progress", "", lambda v, _: {} if v is None else {"logging.progress": not v}),
    "report_to": _honour("logging.report_to", "'none', 'all' (the installed trackers this project runs) or names",
                         tr.report_to),
    "run_name": _honour("logging.run_name"),
    "project": _none("the trackers' project is vlm-grpo here; " + LOG_ONLY),
    "trackio_space_id": _none("trackio (issue 40); " + LOG_ONLY),
    "trackio_bucket_id": _none("trackio (issue 40); " + LOG_ONLY),
    "trackio_static_space_id": _none("trackio (issue 40); " + LOG_ONLY),
    # ------------------------------------------------ evaluation
    "eval_strategy": _honour("(trainer schedule)", "no / steps / epoch: greedy held-out evaluation at those steps "
                             "(and at the end for steps, as transformers does)", tr.schedule("eval_strategy")),
    "eval_steps": _honour("(trainer schedule)", "None: logging_steps", tr.schedule("eval_steps")),
    "eval_delay": _honour("(trainer schedule)", "", tr.schedule("eval_delay")),
    "per_device_eval_batch_size": _honour("eval.eval_batch_size", "TRL counts completions: prompts per generate() "
                                          "call = per_device_eval_batch_size / num_generations_eval",
                                          lambda v, g: {"eval.eval_batch_size": max(
                                              1, v // (g.get("num_generations_eval") or g.get("num_generations") or 1))}),
    "prediction_loss_only": _none(NOT_IN_GRPO),
    "eval_on_start": _honour("(trainer schedule)", "", tr.schedule("eval_on_start")),
    "eval_do_concat_batches": _none(NOT_IN_GRPO),
    "eval_use_gather_object": _none(NOT_IN_GRPO),
    "eval_accumulation_steps": _none(NOT_IN_GRPO),
    "include_for_metrics": _none(NOT_IN_GRPO),
    "batch_eval_metrics": _none(NOT_IN_GRPO),
    "num_generations_eval": _honour("eval.sampled_generations", "completions sampled per held-out prompt for the eval "
                                    "loss and sampled rewards (None: num_generations); the greedy answers are "
                                    "reported beside them", tr.same("eval.sampled_generations")),
    # ------------------------------------------------ saving and the hub
    "save_only_model": _none("checkpoints always hold the optimizer and RNG state too (resume needs them); "
                             "the model files are the same"),
    "save_strategy": _honour("logging.save_every, logging.checkpoint_at_end", "steps / epoch / no (best is "
                             "refused: it needs metric_for_best_model)", tr.save_strategy),
    "save_steps": _honour("logging.save_every", "a float below 1 is a share of max_steps"),
    "save_on_each_node": _none(LAUNCHER),
    "save_total_limit": _honour("logging.keep_checkpoints", "None: all kept",
                                lambda v, _: {"logging.keep_checkpoints": v or 0}),
    "enable_jit_checkpoint": _none("SIGTERM/SIGINT always save the step here"),
    "push_to_hub": _honour("logging.push_to_hub", "pushes final/ with its model card at the end"),
    "hub_token": _none(HUB_OFFLINE),
    "hub_private_repo": _honour("logging.hub_private", "", tr.same("logging.hub_private")),
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
    "accelerator_config": _honour("(read back)", "no dataloader is dispatched here (each process reads its own "
                                  "rows): dispatch_batches is False; True is refused with an iterable train_dataset, "
                                  "as TRL refuses it; configure processes with `accelerate launch`",
                                  tr.schedule("accelerator_config")),
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
    "fsdp": _honour("fsdp", "full_shard / shard_grad_op (FSDP2)", tr.fsdp),
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
                                 "own argument", tr.model_init_kwargs),
    "trust_remote_code": _honour("model.trust_remote_code"),
    "router_aux_loss_coef": _honour("loss.router_aux_loss_coef"),
    "disable_dropout": _honour("(always)", "the policy always runs without dropout here (the ratio compares like with "
                               "like); False, TRL's default, is accepted", lambda v, _: {}),
    "cast_lm_head_to_fp32": Rule(REFUSED, "", "with an fp32 policy the head already runs in fp32 (accepted); with "
                                 "bf16/fp16 the head's matmul runs in half precision and its logits are upcast after: "
                                 "train in float32 (mixed_precision no) for an fp32 head", tr.fp32_head),
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
                                 "onto the model's generation config while it samples", tr.generation_kwargs),
    "chat_template_kwargs": _honour("data.chat_template_kwargs", "", tr.dict_or_empty("data.chat_template_kwargs")),
    "repetition_penalty": _honour("generation.repetition_penalty"),
    "cache_implementation": _honour("generation.cache_implementation"),
    "use_vllm": Rule(REFUSED, "", VLLM, tr.vllm),
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
    "log_multimodal": _honour("logging.log_multimodal", "with log_completions: each prompt's images saved beside "
                              "completions.jsonl, and in trainer._logs['images']"),
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
JOINT = {"adam_beta1": tr.betas, "adam_beta2": tr.betas, "num_train_epochs": tr.length, "max_steps": tr.length}


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


TRL_OUTPUT_DIR = "trainer_output"  # transformers' TrainingArguments: output_dir None means this folder


def trl_run_defaults() -> dict[str, Any]:
    """TRL's default of every honoured field, as a GRPOConfig built in Python starts from them: a TRL script that
    leaves a field unset gets TRL's run (its steps, learning rate and schedule, batch shape, logging moments), not
    this project's CPU-sized CLI defaults. None (TRL's "unset") leaves ours, except output_dir (TRL's folder) and
    bf16: TRL's None means bf16 where the GPU supports it; TRL refuses its own default on a CPU without use_cpu, and
    here a CPU run keeps float32 (bf16 autocast over float32 weights does not pay on a CPU)."""
    import torch

    defaults = trl_defaults()
    out = {name: defaults[name] for name, rule in RULES.items()
           if rule.status == HONOURED and defaults.get(name) is not None}
    out["output_dir"] = defaults.get("output_dir") or TRL_OUTPUT_DIR
    out["data.order"] = "trl"  # TRL's RepeatSampler passes (not a GRPOConfig field: how TRL's trainer draws rows)
    out["guard.audit_at_start"] = False  # TRL never calls a reward before training (audit_rewards=True asks for it)
    out["logging.keep_earlier_run"] = True  # a script run twice into one output_dir: the first run is kept aside
    out["logging.final_at_end"] = False  # TRL saves the model when the script calls save_model()
    if defaults.get("bf16", False) is None and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        out["bf16"] = True
    return out


def plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def is_default(name: str, value: Any, defaults: dict[str, Any]) -> bool:
    if name not in defaults:
        return False
    return plain(value) == plain(defaults[name])


# ------------------------------------------------------------------ translating a GRPOConfig's keywords
def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def refuse_non_numbers(given: dict[str, Any], defaults: dict[str, Any]) -> None:
    """A TRL field whose default is a number given something else (`max_steps="x"`): a SettingError naming it."""
    for name, value in given.items():
        if name in RULES and _number(defaults.get(name)) and value is not None and not _number(value):
            kind = type(defaults[name]).__name__
            raise SettingError(name, f"{value!r} is not a valid {kind}: give a number (TRL's default is "
                               f"{defaults[name]!r})")


def translate(given: dict[str, Any]) -> dict[str, Any]:
    """The keywords of a GRPOConfig as this project's settings (dotted keys; `trl.*` for the trainer's schedule).
    Keywords that are not TRL fields pass through; TRL fields are translated by RULES. A no-effect field given another
    value than TRL's default warns once; refused fields with other values are refused together in one error."""
    defaults = trl_defaults()
    given = {k: plain(v) for k, v in given.items()}
    refuse_non_numbers(given, defaults)  # the translations below compute with them
    out: dict[str, Any] = {}
    refused: list[tuple[str, str]] = []
    for name, value in given.items():
        rule = RULES.get(name)
        if rule is None:
            out[name] = value
            continue
        if rule.status == REFUSED:
            if rule.to is not None:  # refused by its own check (or later, by the trainer that reads what it keeps)
                try:
                    out.update(rule.to(value, given))
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
        if name in tr.BATCH_FIELDS:
            continue  # translated together below
        if name in JOINT:
            out.update(JOINT[name](given))
        elif rule.to is not None:
            out.update(rule.to(value, given))
        elif name == "save_steps" and "save_strategy" in given:
            continue  # the strategy decides
        elif name == "save_steps":
            out["logging.save_every"] = tr.steps_value(value, given, name)
        else:
            out[name] = value  # the same name and meaning here: the settings parser takes it
    if len(refused) == 1:
        raise SettingError(*refused[0])
    if refused:
        raise SettingError(", ".join(name for name, _ in refused), "; ".join(f"{n}: {p}" for n, p in refused))
    if any(name in given for name in tr.BATCH_FIELDS):
        out.update(tr.batch(given))
    if given.get("logging_strategy", "steps") == "steps" and isinstance(given.get("logging_steps"), int):
        out["logging.log_every"] = given["logging_steps"]  # the trackers get TRL's logged steps
    return out
