"""What GRPOTrainer and SFTTrainer share: a trainer built of named parts (grpo/parts/), TRL's trainer surface, and
the one step loop in `train()`.

The parts, each built once from the settings (or from what the caller passed in):
- `ctx` RunContext: settings, accelerator, the locked run directory, metrics.jsonl, trackers;
- `checkpoints` Checkpoints: the `--resume` plan (before any model loads), saves, the final model;
- `data` TrainingData: recipe, rewards, the checked training split;
- `policy` TrainedPolicy: the adapter with LoRA / freeze, optimizer and schedule;
- `evaluation` Evaluation: greedy held-out evaluations;
- the stage's own step parts (GRPOTrainer: sampler, scoring, policy_update, step_log; SFTTrainer: its update).

A stage supplies `train_step(step) -> metrics` and a few class attributes; `from_settings(cfg)` builds one from
resolved settings (the CLI, benchmarks), the constructor from TRL's arguments (api/trainers.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from vlm_grpo.api.callbacks import CallbackBridge
from vlm_grpo.api.schedule import Schedule
from vlm_grpo.api.trl_surface import LoaderRows, as_list, settable
from vlm_grpo.api.trl_arguments import rows_record
from vlm_grpo.grpo.heldout_eval import heldout_metrics
from vlm_grpo.grpo.parts.checkpointing import Checkpoints
from vlm_grpo.grpo.parts.evaluation import Evaluation
from vlm_grpo.grpo.parts.run_context import RunContext
from vlm_grpo.grpo.parts.saves import Saves
from vlm_grpo.grpo.parts.trained_policy import TrainedPolicy, ready_adapter
from vlm_grpo.grpo.parts.training_data import TrainingData
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run import outputs
from vlm_grpo.grpo.run.hub import push_final
from vlm_grpo.grpo.run.logs import log_failure
from vlm_grpo.grpo.checkpoint.manifest import write_manifest
from vlm_grpo.grpo.run.model_card import write_model_card
from vlm_grpo.grpo.run.stop_signals import stop_on_signals
from vlm_grpo.grpo.guards.watchdogs import watchdogs
from vlm_grpo.grpo.training.preflight import check_disk_space
from vlm_grpo.grpo.training.step_size import check_against_memory
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.settings.sources import check_sources, to_yaml
from vlm_grpo.grpo.training.lora import is_lora_wrapped
from vlm_grpo.grpo.training.policy import load_policy
from vlm_grpo.grpo.user_calls import UserCodeError
from vlm_grpo.inspect.run_pages import run_pages


@dataclass
class RunInputs:
    """What a caller may pass instead of the settings building it, and what runs around the loop."""

    adapter: Any = None  # the policy's adapter (None: loaded from model.init_from / model.name)
    recipe: Any = None
    rewards: Sequence[Any] | None = None  # the run's rewards (None: the settings' or the recipe's)
    after_run: Sequence[Callable[[Path], Any]] = ()  # called with the run directory at the end, after its own pages
    step_hooks: Sequence[Callable[[Any, dict], Any]] = ()  # hook(trainer, metrics) after each step; true stops there
    tools: Sequence[Any] = ()  # TRL 1.16's tools, added to the settings' (GRPO)
    environment_factory: Any = None  # TRL 1.16's, replacing the settings' environment (GRPO)
    rollout_func: Callable | None = None  # TRL's rollout_func(prompts, trainer) (GRPO)


class Stage:
    stage = "train"  # names the progress bar and is recorded in checkpoints
    dropout = False  # whether the model trains in train() mode (GRPO: no, the ratio compares like with like)
    needs_rewards = True  # GRPO learns from them; SFT's only score held-out evaluations
    evaluates_around = False  # eval.before_after applies (GRPO)
    config_class: type = object  # TRL's config class of the stage (api/trl_configs.py)

    @classmethod
    def from_settings(cls, cfg: TrainConfig, **inputs: Any):
        """A trainer of resolved settings (the CLI's way); `inputs`: RunInputs' fields."""
        self = cls.__new__(cls)
        self._build(cfg, RunInputs(**inputs), args=cls.config_class.of_settings(), callbacks=())
        return self

    def _build(self, cfg: TrainConfig, inputs: RunInputs, args: Any, callbacks: Sequence[Any]) -> None:
        self.args, self.cfg = args, cfg
        self.callback_bridge = CallbackBridge(callbacks, args)
        self.after_run = [*run_pages(cfg.logging), *inputs.after_run]  # charts (logging.plot), report.html (logging.report)
        self.step_hooks = [self._callbacks_after_step, *inputs.step_hooks]
        self.history: list[dict[str, Any]] = []  # this train()'s steps (ctx.log_history: the run's, resumes included)
        self.step = 0
        self.trained = False  # train() runs once per trainer (a second call is refused: see train())
        if inputs.adapter is None:
            check_sources(cfg)  # a model that cannot load is refused before anything else happens
        self.ctx = RunContext(cfg)
        try:
            self._assemble(inputs)
        except BaseException as err:
            self.ctx.release_lock()
            if self.ctx.is_main and isinstance(err, UserCodeError):  # a refusal at the start leaves the folder as it was
                log_failure(self.ctx.run_dir, err)
            raise
        if getattr(args, "schedule", {}).get("save_strategy") == "epoch":  # TRL's: a checkpoint at each pass's end
            cfg.logging.save_every = self.steps_per_epoch

    def _assemble(self, inputs: RunInputs) -> None:
        ctx, cfg = self.ctx, self.cfg
        ctx.open_log()
        self.checkpoints = Checkpoints(ctx, self.stage)  # settings a checkpoint cannot continue with stop here
        self.checkpoints.on_save.append(lambda step: self.callback_bridge.saved(self, step))  # TRL's on_save
        self.saves = Saves(ctx, self.checkpoints)
        if ctx.is_main:  # the resolved settings (a valid --config) and the run's resumes
            safe_files.write_run_file(ctx.run_dir, "config.yaml", to_yaml(cfg, self.checkpoints.history))
        self.data = TrainingData(ctx, inputs.recipe, inputs.rewards, needs_rewards=self.needs_rewards)
        adapter = ready_adapter(inputs.adapter or load_policy(cfg, ctx.device), cfg)
        self.data.check_against(adapter, self.completion_budget())
        check_against_memory(adapter.model, ctx.device, cfg.data.batch_size, self.completions_per_prompt(),
                             self.completion_budget() + 1)  # before the first step, not inside its allocator
        self.policy = TrainedPolicy(ctx, adapter, dropout=self.dropout, scheduler_steps=self.scheduler_steps(),
                                    after_freeze=self._after_freeze, shard_more=self._shard_more)
        if ctx.is_main:
            check_disk_space(ctx.run_dir, adapter.model)
        self.evaluation = Evaluation(ctx, self.data, self.policy)
        kept = self._assemble_step(inputs)
        if self.policy.masters is not None:  # bf16 weights: their float32 masters travel with every checkpoint
            kept.append(self.policy.masters)
        self.checkpoints.attach(self.policy, kept)

    # ---------------------------------------------------------------- what a stage supplies
    def _assemble_step(self, inputs: RunInputs) -> list:
        """The stage's step parts; returns those whose state the checkpoints carry."""
        return []

    def _after_freeze(self, adapter) -> None:
        """Once the trainable set is final, before the optimizer is built (GRPO: its reference copy)."""

    def _shard_more(self, mode: str) -> None:
        """Under FSDP, shards whatever else the stage keeps (GRPO: its reference copy)."""

    def completion_budget(self) -> int:
        """Tokens a completion may take (for the sequence-budget check)."""
        return self.cfg.generation.max_new_tokens

    def completions_per_prompt(self) -> int:
        """Sequences a step holds per prompt (GRPO: num_generations), for the memory check."""
        return 1

    def scheduler_steps(self) -> int:
        return self.cfg.max_steps

    def progress_postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"loss": f"{metrics.get('loss', float('nan')):.4f}"}

    def halted(self) -> str | None:
        """Why the run stops after this step, saved (GRPO: a guard with on_hacking stop); None: it goes on."""
        return None

    def train_step(self, step: int) -> dict[str, Any]:
        raise NotImplementedError

    # ---------------------------------------------------------------- the loop
    def train(self, resume_from_checkpoint: bool | str | None = None):
        """The run (`resume_from_checkpoint`: True for the newest checkpoint, or a checkpoint path); returns TRL's
        `TrainOutput(global_step, training_loss, metrics)`; `history` holds this run's steps. SIGINT/SIGTERM: the
        step finishes, is saved, and StopSignal is raised (a second one: at once)."""
        from transformers.trainer_utils import TrainOutput

        cfg, ctx = self.cfg, self.ctx
        self._refuse_second_train()
        started = time.perf_counter()
        before = self._begin(resume_from_checkpoint)  # callbacks' on_train_begin, the held-out evaluation before
        with self.saves.failures_logged(lambda: self.step), stop_on_signals() as stop:
            start = self.checkpoints.resume() if cfg.resume or cfg.resume_from else 0
            ctx.trackers.start()
            guards = watchdogs(cfg)
            progress = _progress(start, cfg.max_steps, self.stage, enabled=ctx.is_main and cfg.logging.progress)
            for step in range(start, cfg.max_steps):
                metrics = self._run_step(step)  # saved as the last completed step if it fails before its update
                progress.update(1)
                progress.set_postfix(self.progress_postfix(metrics))
                guards.observe(metrics["step"], metrics)  # a guard that stops the run raises before the step is saved
                self.saves.after_step(step + 1, stop, self.halted(), progress.close)  # periodic, guard's or signal's stop
                if self._hooks_stop(metrics, stop):
                    break
            progress.close()
            self.saves.at_end(self.history[-1]["step"] if self.history else None, stop)  # last checkpoint, final/
        self._end(before)  # the held-out evaluation after, plots and report, card, hub push, trackers
        losses = [m["loss"] for m in self.history if "loss" in m]
        summary = {"train_runtime": time.perf_counter() - started,
                   "train_loss": sum(losses) / len(losses) if losses else float("nan")}
        self.callback_bridge.end(self, summary)
        last = self.history[-1] if self.history else {}
        metrics = {**summary, **{k: v for k, v in last.items() if isinstance(v, (int, float))}}
        return TrainOutput(global_step=last.get("step", 0), training_loss=metrics["train_loss"], metrics=metrics)

    def _refuse_second_train(self) -> None:
        """TRL's Trainer runs a second train() from step 0 with a fresh optimizer and schedule, logging steps 1, 2, 1,
        2 and overwriting its checkpoints and final model. Here a trainer trains once: its run directory's lock is
        released at the end, and the steps, checkpoints and final/ it wrote stay as they are."""
        if self.trained:
            last = self.history[-1]["step"] if self.history else self.step
            raise RuntimeError(
                f"train() already ran on this trainer (to step {last} of max_steps {self.cfg.max_steps}, in "
                f"{self.ctx.run_dir}); a second call would start again at step 0 and overwrite its checkpoints and "
                "final/ (as TRL's Trainer does), so it is refused: to train on, build a new trainer with a larger "
                "max_steps and call train(resume_from_checkpoint=True); for a new run, give a new output_dir")
        self.trained = True

    def _begin(self, resume_from_checkpoint) -> dict[str, Any] | None:
        if resume_from_checkpoint:
            if isinstance(resume_from_checkpoint, bool):
                self.cfg.resume = True
            else:
                self.cfg.resume_from = str(resume_from_checkpoint)
        schedule = Schedule.of(getattr(self.args, "schedule", {}), self.cfg.max_steps, self.steps_per_epoch)
        try:
            self.callback_bridge.begin(self, schedule)
        except BaseException:  # a user's callback failed before the run: the run directory is free again
            self.ctx.release_lock()
            raise
        if schedule.eval_on_start:
            self.evaluate()
        if not (self.evaluates_around and self.cfg.eval.before_after):
            return None
        self.ctx.trackers.start()
        return self.evaluation.before()

    @property
    def steps_per_epoch(self) -> int:
        """TRL's count: partial batches dropped; a generation feeds steps_per_generation steps."""
        batches = max(len(self.data.dataset) // (self.cfg.data.batch_size * self.ctx.accelerator.num_processes), 1)
        return batches * self.cfg.steps_per_generation

    def _run_step(self, step: int) -> dict[str, Any]:
        self.step, self.policy.updated_in_step = step, False
        started, rng_at_start = time.perf_counter(), ckpt.rng_state()
        try:
            metrics = self.train_step(step)
        except Exception:
            self.checkpoints.save_after_failure(step, rng_at_start)
            raise
        metrics.setdefault("step", step + 1)
        metrics.setdefault("step_time", time.perf_counter() - started)
        metrics["skipped_samples"] = len(self.data.skipped)
        self.history.append(metrics)
        self.ctx.log_history.append(metrics)
        self.ctx.log.metrics(metrics)
        self.ctx.trackers.metrics(metrics, metrics["step"])
        return metrics

    def _hooks_stop(self, metrics: dict[str, Any], stop) -> bool:
        """Every hook sees every step; a true result stops the run. A hook that fails keeps the step, saved."""
        try:
            return any([hook(self, metrics) for hook in self.step_hooks])
        except Exception:
            self.saves.keep_completed(int(metrics["step"]), stop)
            raise

    def _end(self, before: dict[str, Any] | None) -> None:
        ctx = self.ctx
        if self.data.skipped and ctx.is_main:
            print(f"skipped {len(self.data.skipped)} bad samples: {list(self.data.skipped)}")
        complete = bool(self.history) and self.history[-1]["step"] == self.cfg.max_steps
        if self.evaluates_around and self.cfg.eval.before_after and complete:
            self.evaluation.after(before)
        if ctx.is_main:
            for hook in self.after_run:
                hook(ctx.run_dir)
        final = ctx.run_dir / "final"
        if ctx.is_main and final.is_dir():
            title = self.write_card(final)
            if self.cfg.logging.push_to_hub:
                url = push_final(final, title, private=self.cfg.logging.hub_private)
                print(f"pushed {final} to {url}")
        ctx.trackers.end()
        ctx.release_lock()

    def _callbacks_after_step(self, trainer, metrics: dict[str, Any]) -> bool:
        """Each step's end, by transformers' DefaultFlowCallback: logged, evaluated; true stops the run."""
        evaluate, stop = self.callback_bridge.step(self, metrics)
        if evaluate:
            self.evaluate()
        return stop

    # ---------------------------------------------------------------- TRL's trainer surface
    @property
    def adapter(self):
        return self.policy.adapter

    @settable
    def model(self):
        return self.policy.adapter.model

    @settable
    def processing_class(self):
        return self.policy.adapter.processor

    @property
    def optimizer(self):
        return self.policy.optimizer

    @property
    def lr_scheduler(self):
        return self.policy.scheduler

    @settable
    def accelerator(self):
        return self.ctx.accelerator

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    @property
    def run_dir(self) -> Path:
        return self.ctx.run_dir

    @property
    def train_dataset(self):
        return self.data.dataset

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
        cfg = self.cfg
        g = cfg.data.num_generations if self.stage == "grpo" else 1
        order = [i for step in range(cfg.max_steps // cfg.steps_per_generation or 1)
                 for i in self.data.batch(step).rows for _ in range(g)]
        return torch.utils.data.DataLoader(LoaderRows(self.data.dataset, order), batch_size=cfg.data.batch_size * g,
                                           num_workers=self._workers(getattr(self, "train_dataset_given", None)), collate_fn=as_list)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
        """The held-out rows (`eval_dataset`, else the run's), eval.eval_batch_size prompts a batch; a stream is read
        by one worker (the override is this loader's alone: args keep their value)."""
        given = eval_dataset if eval_dataset is not None else getattr(self, "eval_dataset", None)
        rows = self.evaluation.heldout_data
        return torch.utils.data.DataLoader(LoaderRows(rows, list(range(len(rows)))), batch_size=self.cfg.eval.eval_batch_size,
                                           num_workers=self._workers(given), collate_fn=as_list)

    def _workers(self, data: Any) -> int:
        from datasets import IterableDataset

        return 0 if isinstance(data, IterableDataset) else int(getattr(self.args, "dataloader_num_workers", 0) or 0)

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

    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Held-out evaluation of the policy as it is now: greedy answers (accuracy, rewards) and, for GRPO, sampled
        completions (eval loss, sampled rewards), on `eval_dataset` when given, else the run's (`eval_dataset` of the
        constructor, or the recipe's split). A mapping of datasets (dict, DatasetDict) is evaluated one by one, each
        under `{metric_key_prefix}_{name}_`, as TRL's trainer does."""
        history = self.ctx.log_history
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
        rows = self.evaluation.heldout_data
        if eval_dataset is not None:  # this evaluation only: the run's own held-out data stays as it was
            rows = self.evaluation.heldout_of(str(rows_record(eval_dataset, "eval_dataset")))
        report = self.evaluation.evaluate(step, rows)
        self.evaluation.reports[f"step {step}"] = report  # the model card shows it
        metrics = {f"{prefix}_{k.split('/', 1)[1]}": v for k, v in heldout_metrics(report).items()}
        metrics.update({f"{prefix}_rewards/{k}": v for k, v in report["rewards"].items() if v is not None})
        sampled = self.sampled_metrics(rows, step)
        if sampled and f"{prefix}_reward" in metrics:  # TRL's eval_reward is the sampled one; the greedy one is named
            metrics[f"{prefix}_greedy_reward"] = metrics.pop(f"{prefix}_reward")
        metrics.update({f"{prefix}_{k}": v for k, v in sampled.items()})
        self.last_evaluation = report
        return metrics

    def sampled_metrics(self, rows, step: int) -> dict[str, float]:
        """Metrics of completions sampled on the held-out rows (GRPO: the eval loss); none by default."""
        return {}

    def write_card(self, folder: Path | None = None, title: str | None = None) -> str:
        """The model card (with any held-out results) in `folder` (default final/), its manifest brought up to
        date; returns the title it carries."""
        folder = folder or self.ctx.run_dir / "final"
        title = title or self.cfg.logging.hub_model_id or self.ctx.run_dir.resolve().name
        card = write_model_card(folder, self.ctx.run_dir, self.cfg, stage=self.stage, family=self.adapter.family,
                                rewards=self.data.rewards, heldout=self.evaluation.reports, title=title,
                                lora=is_lora_wrapped(self.adapter), history=self.checkpoints.history)
        write_manifest(folder, changed=card)  # the weights were hashed when they were saved
        return title

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """The model (or LoRA adapter) and processor with its model card, in the run's final/ (default) or
        `output_dir`; returns the folder."""
        final = self.ctx.run_dir / "final"
        if output_dir is None or Path(output_dir).resolve() == final.resolve():
            self.checkpoints.save_final()
            self.write_card(final)
            return final
        out = Path(output_dir)
        if self.ctx.is_main:  # written whole beside `out`, then renamed: a folder of other files is moved aside
            staging = outputs.staging_for(out)
            ckpt.save_model(self.adapter, staging)
            write_manifest(staging)
            self.write_card(staging)
            note = outputs.commit_folder(staging, out)
            if note:
                print(note)
        return out

    def push_to_hub(self, repo_id: str | None = None, *, private: bool | None = None,
                    commit_message: str = "vlm-grpo run") -> str:
        """final/ (saved now if the run has not saved it) with its card, to the hub repo `repo_id` (default:
        logging.hub_model_id, else the run directory's name); returns the commit's URL."""
        final = self.ctx.run_dir / "final"
        if not final.is_dir():
            self.checkpoints.save_final()
        title = self.write_card(final, title=repo_id)
        private = self.cfg.logging.hub_private if private is None else private
        return push_final(final, title, private=private, commit_message=commit_message)


def _progress(start: int, total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc=desc, unit="step", dynamic_ncols=True)
