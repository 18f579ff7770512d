"""`GRPOTrainer` and `SFTTrainer` with TRL's shape, over this project's own trainers (grpo/trainer.py, grpo/sft.py).

    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[accuracy], args=GRPOConfig(max_steps=2),
                          train_dataset=dataset)
    trainer.train(); trainer.evaluate(); trainer.save_model(); trainer.push_to_hub("me/model")

What is given is turned into the run's parts (api/parts.py) and recorded in its settings, so config.yaml and the
model card say what the run was made of: a model object by the path it was loaded from (or its class), a function
by its qualified name, rows in memory by their type, fingerprint, columns and size. Like TRL's, the trainer builds
everything when it is made (the model loaded, the data read and checked, LoRA applied), and `train()` runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from vlm_grpo.api.callbacks import CallbackBridge
from vlm_grpo.api.config import GRPOConfig, SFTConfig
from vlm_grpo.api.parts import adapter_for, lora_settings, model_record, records, reward_parts
from vlm_grpo.api.schedule import Schedule
from vlm_grpo.grpo.data.source import MEMORY, remember_rows
from vlm_grpo.grpo.evaluate import heldout_metrics
from vlm_grpo.grpo.rewards.scoring import weighed
from vlm_grpo.grpo.settings.sources import load_recipe_config, merge_settings
from vlm_grpo.grpo.sft import SFTTrainer as SFTRun
from vlm_grpo.grpo.trainer import GRPOTrainer as GRPORun


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


def _rows_record(data: Any, name: str) -> str:
    """A dataset argument as data.dataset holds it: a path or hub id as given, rows in memory as their record."""
    return data if isinstance(data, (str, Path)) else remember_rows(data, name)


class _Trainer:
    config_class: type = GRPOConfig
    run_class: type = GRPORun  # the project's trainer this one drives

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Sequence[Any] | None = None, optimizers: tuple = (None, None), peft_config: Any = None,
                 tools: Sequence[Any] | None = None, environment_factory: Any = None, rollout_func: Any = None):
        import torch

        tool_parts = {}
        if tools or environment_factory is not None:  # TRL 1.16's multi-turn rollouts (grpo/tools/toolset.py)
            if self.run_class is not GRPORun:
                raise ValueError("tools / environment_factory: only GRPO rollouts call tools")
            tool_parts = {"tools": list(tools or ()), "environment_factory": environment_factory}
        if any(part is not None for part in optimizers or ()):
            raise ValueError("optimizers: the optimizer is built here, one learning rate per module group "
                             "(optim.learning_rate, vision_lr, projector_lr ...); give optimizers=(None, None)")
        self.args = args if args is not None else self.config_class()
        layers = [self.args.mapping(), {"model": {"name": str(model_record(model))}}]
        data = {}
        if train_dataset is not None:
            data["dataset"] = str(_rows_record(train_dataset, "train_dataset"))
        if eval_dataset is not None:
            data["eval_dataset"] = str(_rows_record(eval_dataset, "eval_dataset"))
        layers.append({"data": data})
        if peft_config is not None:
            layers.append(lora_settings(peft_config))
        cfg, recipe = load_recipe_config(settings=merge_settings(*layers))
        schedule = getattr(self.args, "schedule", {})
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
        self.callback_bridge = CallbackBridge(callbacks or [], self.args)
        # TRL calls rollout_func(prompts, trainer) with its own trainer: this one
        parts = {"rollout_func": lambda prompts, _run: rollout_func(prompts, self)} if rollout_func is not None else {}
        parts.update(tool_parts)
        self.run = self.run_class(cfg, adapter=adapter, recipe=recipe, rewards=rewards, step_hooks=[self._after_step],
                                  **parts)
        run = self.run
        prompts_per_step = cfg.data.batch_size * run.accelerator.num_processes
        self.steps_per_epoch = max(len(run.dataset) // prompts_per_step, 1)  # TRL's count: partial batches dropped
        if schedule.get("save_strategy") == "epoch":  # a checkpoint at each pass's end (the last step: at the end)
            run.cfg.logging.save_every = self.steps_per_epoch
        saving = run.save

        def save_and_tell(step: int, *args: Any, **kwargs: Any):
            path = saving(step, *args, **kwargs)
            self.callback_bridge.saved(run, step)
            return path

        run.save = save_and_tell  # on_save after every checkpoint the run writes

    # ---------------------------------------------------------------- what TRL's trainers expose
    @property
    def model(self):
        return self.run.adapter.model

    @property
    def processing_class(self):
        return self.run.adapter.processor

    @property
    def state(self):
        return self.callback_bridge.state

    @property
    def accelerator(self):
        return self.run.accelerator

    @property
    def callback_handler(self):
        return self.callback_bridge.handler

    def add_callback(self, callback: Any) -> None:
        """A `TrainerCallback` (class or instance) added to the run's callbacks, as TRL's trainer takes it."""
        self.callback_bridge.add(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Removes a callback (class: its first instance) and returns it; None when there is none."""
        return self.callback_bridge.pop(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callback_bridge.remove(callback)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's Trainer.log: an entry of state.log_history at the current step, handed to every callback's on_log."""
        self.callback_bridge.log(logs)

    def _after_step(self, run, metrics: dict[str, Any]) -> bool:
        """Each step's end, by transformers' DefaultFlowCallback: logged, evaluated; true stops the run."""
        evaluate, stop = self.callback_bridge.step(run, metrics)
        if evaluate:
            self.evaluate()
        return stop

    def _schedule(self) -> Schedule:
        return Schedule.of(getattr(self.args, "schedule", {}), self.run.cfg.max_steps, self.steps_per_epoch)

    @property
    def train_dataset(self):
        return self.run.dataset

    def train(self, resume_from_checkpoint: bool | str | None = None):
        """The run (`resume_from_checkpoint`: True for the newest checkpoint, or a checkpoint path); returns TRL's
        `TrainOutput(global_step, training_loss, metrics)`."""
        from transformers.trainer_utils import TrainOutput

        if resume_from_checkpoint:
            if isinstance(resume_from_checkpoint, bool):
                self.run.cfg.resume = True
            else:
                self.run.cfg.resume_from = str(resume_from_checkpoint)
        started = time.perf_counter()
        schedule = self._schedule()
        try:
            self.callback_bridge.begin(self.run, schedule)
        except BaseException:  # a user's callback failed before the run: the run directory is free again
            self.run.release_lock()
            raise
        if schedule.eval_on_start:
            self.evaluate()
        history = self.run.train()
        losses = [m["loss"] for m in history if "loss" in m]
        summary = {"train_runtime": time.perf_counter() - started,
                   "train_loss": sum(losses) / len(losses) if losses else float("nan")}
        self.callback_bridge.end(self.run, summary)
        metrics = {**summary,
                   **{k: v for k, v in (history[-1] if history else {}).items() if isinstance(v, (int, float))}}
        return TrainOutput(global_step=history[-1]["step"] if history else 0, training_loss=metrics["train_loss"],
                           metrics=metrics)

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Greedy held-out evaluation (the eval section's split and size) of the policy as it is now, on
        `eval_dataset` when given, else the run's (`eval_dataset` of the constructor, or the recipe's split)."""
        step = self.run.log_history[-1]["step"] if self.run.log_history else 0
        if eval_dataset is None:
            report = self.run.evaluate(step)
        else:  # this evaluation only: the run's own held-out data stays as it was
            data, cached = self.run.cfg.data, self.run.__dict__.pop("heldout_data", None)
            given, data.eval_dataset = data.eval_dataset, str(_rows_record(eval_dataset, "eval_dataset"))
            try:
                report = self.run.evaluate(step)
            finally:
                data.eval_dataset = given
                self.run.__dict__.pop("heldout_data", None)
                if cached is not None:
                    self.run.__dict__["heldout_data"] = cached
        self.run.heldout[f"step {step}"] = report  # the model card shows it
        metrics = {f"{metric_key_prefix}_{k.split('/', 1)[1]}": v for k, v in heldout_metrics(report).items()}
        metrics.update({f"{metric_key_prefix}_rewards/{k}": v for k, v in report["rewards"].items() if v is not None})
        self.last_evaluation = report
        self.callback_bridge.evaluated(self.run, metrics)
        return metrics

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """The model (or LoRA adapter) and processor with its model card, in the run's final/ (default) or
        `output_dir`; returns the folder."""
        from vlm_grpo.grpo.run.checkpoints import save_model
        from vlm_grpo.grpo.run.manifest import write_manifest

        run = self.run
        final = run.run_dir / "final"
        if output_dir is None or Path(output_dir).resolve() == final.resolve():
            run.save_final()
            run.write_card(final)
            return final
        out = Path(output_dir)
        if run.is_main:
            out.mkdir(parents=True, exist_ok=True)
            save_model(run.adapter, out)
            write_manifest(out)
            run.write_card(out)
        return out

    def push_to_hub(self, repo_id: str | None = None, *, private: bool | None = None,
                    commit_message: str = "vlm-grpo run") -> str:
        """final/ (saved now if the run has not saved it) with its card, to the hub repo `repo_id` (default:
        logging.hub_model_id, else the run directory's name); returns the commit's URL."""
        from vlm_grpo.grpo.run.hub import push_final

        run = self.run
        final = run.run_dir / "final"
        if not final.is_dir():
            run.save_final()
        title = run.write_card(final, title=repo_id)
        private = run.cfg.logging.hub_private if private is None else private
        return push_final(final, title, private=private, commit_message=commit_message)


class GRPOTrainer(_Trainer):
    """TRL's `GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
    reward_processing_classes, callbacks, optimizers, peft_config, tools, environment_factory, rollout_func)` over
    vlm-grpo's GRPO loop; `tools` are typed functions with Google-style docstrings (sync or async), `environment_factory`
    a class whose public methods are tools plus `reset()` and an optional `get_reward()` (or a dict of them), as in
    TRL 1.16."""

    config_class = GRPOConfig
    run_class = GRPORun


class SFTTrainer(_Trainer):
    """TRL's `SFTTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class, callbacks,
    optimizers, peft_config)` over vlm-grpo's supervised warm-up: the loss is on each row's `completion` only.
    `reward_funcs` (optional) score the held-out evaluations."""

    config_class = SFTConfig
    run_class = SFTRun

    def __init__(self, model: Any, args: SFTConfig | None = None, data_collator: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, callbacks: Sequence[Any] | None = None,
                 optimizers: tuple = (None, None), peft_config: Any = None, reward_funcs: Any = None):
        if data_collator is not None:
            raise ValueError("data_collator: batches are built by the model's adapter (prompts and images encoded "
                             "once, the completion appended); give data_collator=None")
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, processing_class, None, callbacks,
                         optimizers, peft_config)
