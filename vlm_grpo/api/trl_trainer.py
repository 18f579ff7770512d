"""TRL's trainer surface over a built stage (grpo/loop/, `trainer.run`): what GRPOTrainer and SFTTrainer share. It translates
what a TRL script gives and expects into the stage's inputs and moments: transformers' callbacks (api/callbacks.py)
on the loop's begin, steps, saves and end; TRL's evaluation and save schedule; the pages a run writes at its end
(inspect/run_pages.py: charts, report.html), handed to the loop whichever way the run started; and the attributes
and methods scripts use (`trainer.model`, `trainer.state`, `evaluate()`, `save_model()`, `push_to_hub()` ...)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from vlm_grpo.api.callbacks import CallbackBridge
from vlm_grpo.api.schedule import Schedule
from vlm_grpo.api.trl_arguments import rows_record
from vlm_grpo.api.trl_surface import LoaderRows, as_list, settable
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo.checkpoint.manifest import write_manifest
from vlm_grpo.grpo.heldout_eval import heldout_metrics
from vlm_grpo.grpo.loop.stage import RunInputs, Stage
from vlm_grpo.grpo.run import outputs
from vlm_grpo.grpo.run.hub import push_final
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.inspect.run_pages import run_pages


class TRLTrainer:
    """A trainer over one built stage (`run`): `stage_class` builds it, `config_class` is TRL's config class."""

    stage_class: type = Stage
    config_class: type = object

    @classmethod
    def from_settings(cls, cfg: TrainConfig, **inputs: Any):
        """A trainer of resolved settings (the CLI's way); `inputs`: RunInputs' fields."""
        self = cls.__new__(cls)
        self._build(cfg, RunInputs(**inputs), args=cls.config_class.of_settings(), callbacks=())
        return self

    def _build(self, cfg: TrainConfig, inputs: RunInputs, args: Any, callbacks: Sequence[Any]) -> None:
        """The stage built from `inputs` with what a TRL run adds around its loop."""
        self.args = args
        self.callback_bridge = CallbackBridge(callbacks, args)
        schedule = getattr(args, "schedule", {})
        inputs = replace(
            inputs,
            after_run=[*run_pages(cfg.logging), *inputs.after_run],  # charts (logging.plot), report.html (logging.report)
            step_hooks=[self._callbacks_after_step, *inputs.step_hooks],
            save_each_epoch=inputs.save_each_epoch or schedule.get("save_strategy") == "epoch",
            owner=self, on_begin=self._on_begin, on_end=self._on_end)
        self.run = self.stage_class(cfg, inputs)
        self.run.checkpoints.on_save.append(lambda step: self.callback_bridge.saved(self, step))  # TRL's on_save

    def __getattr__(self, name: str) -> Any:
        """The run's parts and state, read through the trainer (`trainer.policy`, `trainer.sampler`,
        `trainer.timings`, `trainer.train_step(step)` ...)."""
        run = self.__dict__.get("run")
        if run is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(run, name)

    def train_step(self, step: int) -> dict[str, Any]:
        """One step of the run; the loop calls it through the trainer, so a subclass may wrap it (faults injected,
        timing) and reach the run's own with super().train_step(step)."""
        return self.run.train_step(step)

    def train(self, resume_from_checkpoint: bool | str | None = None):
        """The run (`resume_from_checkpoint`: True for the newest checkpoint, or a checkpoint path); returns TRL's
        `TrainOutput(global_step, training_loss, metrics)`; `history` holds this run's steps. SIGINT/SIGTERM: the
        step finishes, is saved, and StopSignal is raised (a second one: at once)."""
        return self.run.train(resume_from_checkpoint)

    # ---------------------------------------------------------------- the loop's moments
    def _on_begin(self) -> None:
        schedule = Schedule.of(getattr(self.args, "schedule", {}), self.run.cfg.max_steps, self.run.steps_per_epoch)
        self.callback_bridge.begin(self, schedule)
        if schedule.eval_on_start:
            self.evaluate()

    def _on_end(self, summary: dict[str, float]) -> None:
        self.callback_bridge.end(self, summary)

    def _callbacks_after_step(self, trainer, metrics: dict[str, Any]) -> bool:
        """Each step's end, by transformers' DefaultFlowCallback: logged, evaluated; true stops the run."""
        evaluate, stop = self.callback_bridge.step(self, metrics)
        if evaluate:
            self.evaluate()
        return stop

    # ---------------------------------------------------------------- TRL's trainer surface
    @settable
    def model(self):
        return self.run.policy.adapter.model

    @settable
    def processing_class(self):
        return self.run.policy.adapter.processor

    @property
    def optimizer(self):
        return self.run.policy.optimizer

    @property
    def lr_scheduler(self):
        return self.run.policy.scheduler

    @settable
    def accelerator(self):
        return self.run.ctx.accelerator

    @property
    def is_main(self) -> bool:
        return self.run.ctx.is_main

    @property
    def run_dir(self) -> Path:
        return self.run.ctx.run_dir

    @property
    def train_dataset(self):
        return self.run.data.dataset

    @settable
    def state(self):
        return self.callback_bridge.state

    @property
    def callback_handler(self):
        return self.callback_bridge.handler

    @settable
    def _metrics(self) -> dict[str, dict[str, list]]:
        """TRL's per-mode lists of the numbers logged since the last log ("train": this run's steps since then)."""
        pending: dict[str, list] = {}
        for entry in self.callback_bridge.pending:
            for key, value in entry.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    pending.setdefault(key, []).append(value)
        return {"train": pending, "eval": {}}

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """The training rows in the run's order, one batch per generation (each prompt num_generations times in a
        row, as TRL's sampler yields them), with args.dataloader_num_workers workers (0 for a stream)."""
        cfg = self.run.cfg
        g = cfg.data.num_generations if self.run.stage == "grpo" else 1
        order = [i for step in range(cfg.max_steps // cfg.steps_per_generation or 1)
                 for i in self.run.data.batch(step).rows for _ in range(g)]
        return torch.utils.data.DataLoader(LoaderRows(self.run.data.dataset, order), batch_size=cfg.data.batch_size * g,
                                           num_workers=self._workers(getattr(self, "train_dataset_given", None)), collate_fn=as_list)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
        """The held-out rows (`eval_dataset`, else the run's), eval.eval_batch_size prompts a batch; a stream is read
        by one worker (the override is this loader's alone: args keep their value)."""
        given = eval_dataset if eval_dataset is not None else getattr(self, "eval_dataset", None)
        rows = self.run.evaluation.heldout_data
        return torch.utils.data.DataLoader(LoaderRows(rows, list(range(len(rows)))), batch_size=self.run.cfg.eval.eval_batch_size,
                                           num_workers=self._workers(given), collate_fn=as_list)

    def _workers(self, data: Any) -> int:
        from datasets import IterableDataset

        return 0 if isinstance(data, IterableDataset) else int(getattr(self.args, "dataloader_num_workers", 0) or 0)

    def add_callback(self, callback: Any) -> None:
        """A `TrainerCallback` (class or instance) added to the run's callbacks, as TRL's trainer takes it."""
        self.callback_bridge.handler.add_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        """Removes a callback (class: its first instance) and returns it; None when there is none."""
        return self.callback_bridge.handler.pop_callback(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callback_bridge.handler.remove_callback(callback)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's Trainer.log: an entry of state.log_history at the current step, handed to every callback's on_log."""
        self.callback_bridge.log(logs)

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Held-out evaluation of the policy as it is now: greedy answers (accuracy, rewards) and, for GRPO, sampled
        completions (eval loss, sampled rewards), on `eval_dataset` when given, else the run's (`eval_dataset` of the
        constructor, or the recipe's split). A mapping of datasets (dict, DatasetDict) is evaluated one by one, each
        under `{metric_key_prefix}_{name}_`, as TRL's trainer does."""
        history = self.run.ctx.log_history
        step = history[-1]["step"] if history else 0
        if isinstance(eval_dataset, Mapping):
            metrics: dict[str, float] = {}
            for name, data in eval_dataset.items():
                metrics.update(self._evaluate_on(data, f"{metric_key_prefix}_{name}", step))
        else:
            metrics = self._evaluate_on(eval_dataset, metric_key_prefix, step)
        self.callback_bridge.evaluated(self, metrics)
        return metrics

    def _evaluate_on(self, eval_dataset: Any, prefix: str, step: int) -> dict[str, float]:
        rows = self.run.evaluation.heldout_data
        if eval_dataset is not None:  # this evaluation only: the run's own held-out data stays as it was
            rows = self.run.evaluation.heldout_of(str(rows_record(eval_dataset, "eval_dataset")))
        report = self.run.evaluation.evaluate(step, rows)
        self.run.evaluation.reports[f"step {step}"] = report  # the model card shows it
        metrics = {f"{prefix}_{k.split('/', 1)[1]}": v for k, v in heldout_metrics(report).items()}
        metrics.update({f"{prefix}_rewards/{k}": v for k, v in report["rewards"].items() if v is not None})
        sampled = self.run.sampled_metrics(rows, step)
        if sampled and f"{prefix}_reward" in metrics:  # TRL's eval_reward is the sampled one; the greedy one is named
            metrics[f"{prefix}_greedy_reward"] = metrics.pop(f"{prefix}_reward")
        metrics.update({f"{prefix}_{k}": v for k, v in sampled.items()})
        self.last_evaluation = report
        return metrics

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """The model (or LoRA adapter) and processor with its model card, in the run's final/ (default) or
        `output_dir`; returns the folder."""
        final = self.run.ctx.run_dir / "final"
        if output_dir is None or Path(output_dir).resolve() == final.resolve():
            self.run.checkpoints.save_final()
            self.run.write_card(final)
            return final
        out = Path(output_dir)
        if self.run.ctx.is_main:  # written whole beside `out`, then renamed: a folder of other files is moved aside
            staging = outputs.staging_for(out)
            ckpt.save_model(self.run.adapter, staging)
            write_manifest(staging)
            self.run.write_card(staging)
            note = outputs.commit_folder(staging, out)
            if note:
                print(note)
        return out

    def push_to_hub(self, repo_id: str | None = None, *, private: bool | None = None,
                    commit_message: str = "vlm-grpo run") -> str:
        """final/ (saved now if the run has not saved it) with its card, to the hub repo `repo_id` (default:
        logging.hub_model_id, else the run directory's name); returns the commit's URL."""
        final = self.run.ctx.run_dir / "final"
        if not final.is_dir():
            self.run.checkpoints.save_final()
        title = self.run.write_card(final, title=repo_id)
        private = self.run.cfg.logging.hub_private if private is None else private
        return push_final(final, title, private=private, commit_message=commit_message)
