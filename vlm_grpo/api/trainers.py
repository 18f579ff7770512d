"""`GRPOTrainer` and `SFTTrainer`, TRL-shaped, and the only trainers: the CLI builds them from its settings
(`from_settings`), a script from TRL's arguments.

    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[accuracy], args=GRPOConfig(max_steps=2),
                          train_dataset=dataset)
    trainer.train(); trainer.evaluate(); trainer.save_model(); trainer.push_to_hub("me/model")

Like TRL's, a trainer builds everything when it is made (the model loaded, the data read and checked, LoRA
applied), and `train()` runs. Each is TRL's surface (api/trl_trainer.py) over a stage of the loop: GRPOStage
(grpo/loop/grpo_stage.py, GRPO's step read top-down) and SFTStage (grpo/loop/sft_stage.py). What is here translates
TRL's constructor arguments into the stage's settings and inputs, and keeps TRL's own attributes and methods.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from vlm_grpo.api.argument_types import (args_argument, callable_argument, callables_argument, check_common,
                                         environment_argument, optimizers_argument, reward_funcs_argument)
from vlm_grpo.api.trl_configs import GRPOConfig, SFTConfig
from vlm_grpo.api.trl_objects import reward_processing_list
from vlm_grpo.api.trl_arguments import settings_of
from vlm_grpo.api.trl_fields import LIGER
from vlm_grpo.api.trl_surface import settable
from vlm_grpo.api.trl_trainer import TRLTrainer
from vlm_grpo.grpo.loop.grpo_stage import GRPOStage
from vlm_grpo.grpo.loop.sft_stage import SFTStage
from vlm_grpo.grpo.loop.stage import RunInputs

RESUME_HINT = "train(resume_from_checkpoint=True)"  # how a script continues a stopped run (the CLI: --resume)


class GRPOTrainer(TRLTrainer):
    """TRL's `GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
    reward_processing_classes, callbacks, optimizers, peft_config, tools, environment_factory, rollout_func)`;
    `tools` are typed functions with Google-style docstrings (sync or async), `environment_factory` a class whose
    public methods are tools plus `reset()` and an optional `get_reward()` (or a dict of them), as in TRL 1.16."""

    stage_class = GRPOStage
    config_class = GRPOConfig

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | Mapping[str, Any] | None = None,
                 train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Sequence[Any] | None = None, optimizers: tuple = (None, None), peft_config: Any = None,
                 tools: Sequence[Any] | None = None, environment_factory: Any = None, rollout_func: Any = None):
        model = check_common(model, train_dataset, eval_dataset, callbacks)
        reward_funcs_argument(reward_funcs)
        callables_argument("tools", tools, "tool functions")
        environment_argument(environment_factory)
        callable_argument("rollout_func", rollout_func, "a function rollout_func(prompts, trainer)")
        optimizers = optimizers_argument(optimizers)
        args = args_argument(args, self.config_class)
        if getattr(args, "schedule", {}).get("use_liger_kernel"):
            raise ValueError(f"use_liger_kernel=True: {LIGER}")
        if train_dataset is None and environment_factory is None and not _names_data(args):
            raise ValueError("`train_dataset` is required: give the prompts as train_dataset (a datasets.Dataset or "
                             "a list of dicts), or name them in the settings (data.recipe, data.dataset)")
        if _streams(train_dataset):  # TRL's rules for an iterable train_dataset
            if args.accelerator_config.dispatch_batches:
                raise ValueError("Iterable datasets require `dispatch_batches=False` (accelerator_config): each "
                                 "process reads its own share of the stream")
            if args.dataloader_num_workers:  # workers would interleave the stream and split the prompt groups
                args.dataloader_num_workers = 0
        funcs = reward_funcs if reward_funcs is None or isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.reward_processing_classes = reward_processing_list(reward_processing_classes, len(funcs or []))
        self.eval_dataset = eval_dataset  # as given (TRL's attribute); the run reads it through the settings
        self.train_dataset_given, self.rollout_func = train_dataset, rollout_func
        cfg, recipe, given = settings_of(args, model, reward_funcs, train_dataset, eval_dataset, processing_class,
                                         reward_processing_classes, optimizers, peft_config)
        inputs = RunInputs(recipe=recipe, tools=list(tools or ()), environment_factory=environment_factory,
                           rollout_func=rollout_func, resume_hint=RESUME_HINT, **given)
        self._build(cfg, inputs, args=args, callbacks=callbacks or ())

    # ---------------------------------------------------------------- TRL's GRPOTrainer attributes
    @property
    def ref_model(self):
        """The frozen reference model (None: beta 0, or LoRA's base serves as the reference), TRL's name."""
        return self.run.reference

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient as it stands (adaptive: after the last update), TRL's attribute."""
        return self.run.entropy_control.coef

    @property
    def aux_loss_enabled(self) -> bool:
        """Whether the MoE routers' load-balancing loss joins the loss (TRL's attribute)."""
        return self.run.router_aux_coef > 0

    @settable
    def _logs(self) -> dict[str, Any]:
        """TRL's buffers of the last generation: prompt, completion, rewards (per function), advantages, extra
        (columns rewards logged with log_extra) and images (with log_multimodal)."""
        return self.run.step_log.trl_logs

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's method: the tokens at or above the `threshold` quantile of the entropies of every process's
        unmasked tokens."""
        from vlm_grpo.grpo.algorithm.losses.objective import Collective, high_entropy_mask

        gather = self.accelerator.gather if self.accelerator.num_processes > 1 else (lambda t: t)
        return high_entropy_mask(entropies, mask, threshold, Collective(gather=gather))

    @staticmethod
    def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
        """TRL's method: [N, 1], 0 for a negative-advantage sequence whose mean KL(sampling || policy) over its
        tokens exceeds the threshold."""
        from vlm_grpo.grpo.algorithm.losses.objective import off_policy_mask

        return off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold)

    def _generate(self, prompts: list) -> tuple:
        """TRL's rollout call with a rollout_func: (prompt_ids, completion_ids, tool_mask, logprobs, extra columns)
        of `prompts` (each prompt entry as the dataset wrote it), the output checked as the run checks it."""
        from vlm_grpo.grpo.rollout.custom import checked_output

        rollout_func = getattr(self, "rollout_func", None)
        if rollout_func is None:
            raise ValueError("_generate without a rollout_func: this trainer samples inside its step "
                             "(GRPOTrainer.train_step); give rollout_func to generate by your own function")
        output = checked_output(rollout_func(prompts, self))
        extra = {k: v for k, v in output.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        return output["prompt_ids"], output["completion_ids"], output.get("env_mask"), output["logprobs"], extra


def _streams(data: Any) -> bool:
    """An iterable (streaming) dataset: no length, rows read in order."""
    from datasets import IterableDataset

    return isinstance(data, IterableDataset)


def _names_data(args) -> bool:
    """Whether the settings name the training prompts without a train_dataset argument: a dataset, a recipe given as
    a keyword, or a settings file (which may name either)."""
    if args.train_config.data.dataset is not None or args.config_file is not None:
        return True
    given, section = args.given, args.given.get("data")
    return "recipe" in given or "data.recipe" in given or (isinstance(section, dict) and "recipe" in section)


class SFTTrainer(TRLTrainer):
    """TRL's `SFTTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class, callbacks,
    optimizers, peft_config)` over vlm-grpo's supervised warm-up: the loss is on each row's `completion` only.
    `reward_funcs` (optional) score the held-out evaluations."""

    stage_class = SFTStage
    config_class = SFTConfig

    def __init__(self, model: Any, args: SFTConfig | Mapping[str, Any] | None = None, data_collator: Any = None,
                 train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, callbacks: Sequence[Any] | None = None,
                 optimizers: tuple = (None, None), peft_config: Any = None, reward_funcs: Any = None):
        if data_collator is not None:
            raise ValueError("data_collator: batches are built by the model's adapter (prompts and images encoded "
                             "once, the completion appended); give data_collator=None")
        model = check_common(model, train_dataset, eval_dataset, callbacks)
        reward_funcs_argument(reward_funcs)
        optimizers = optimizers_argument(optimizers)
        args = args_argument(args, self.config_class)
        cfg, recipe, given = settings_of(args, model, reward_funcs, train_dataset, eval_dataset, processing_class,
                                         None, optimizers, peft_config)
        self._build(cfg, RunInputs(recipe=recipe, resume_hint=RESUME_HINT, **given), args=args, callbacks=callbacks or ())
