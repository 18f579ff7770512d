"""The loop GRPO and SFT share: a stage built of named parts (grpo/parts/), in one pass, and the one step loop in
`train()`.

The parts, each built once from the validated settings (or from what the caller passed in), which the build never
changes (what it derives lives in the parts):
- `ctx` RunContext: settings, accelerator, the locked run directory, metrics.jsonl, trackers;
- `checkpoints` Checkpoints: the `--resume` plan (before any model loads), saves, the final model; `saves` Saves:
  when the loop saves and how it stops;
- `data` TrainingData: recipe, rewards, the checked training split;
- `reference` Reference (GRPO): which model, if any, gives the KL term's log-probs;
- `policy` TrainedPolicy: the adapter with LoRA / freeze, optimizer and schedule;
- `evaluation` Evaluation: greedy held-out evaluations;
- the stage's own step parts (grpo/loop/grpo_stage.py: sampler, scoring, policy_update, step_log; sft_stage.py: its
  update).

A stage supplies `train_step(step) -> metrics` and a few class attributes. The layer above (api/: TRL's trainers)
builds one from TRL's arguments or resolved settings and hands in what runs around the loop (RunInputs: step hooks,
the pages written at the end, the moments TRL's callbacks see), never the other way round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from vlm_grpo.grpo.parts.checkpointing import Checkpoints
from vlm_grpo.grpo.parts.evaluation import Evaluation
from vlm_grpo.grpo.parts.run_context import RunContext
from vlm_grpo.grpo.parts.saves import Saves
from vlm_grpo.grpo.parts.trained_policy import TrainedPolicy, prepare_weights, ready_adapter
from vlm_grpo.grpo.parts.training_data import TrainingData
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo import safe_files
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
from vlm_grpo.grpo.checkpoint.resume_target import check_resume_from
from vlm_grpo.grpo.training.lora import is_lora_wrapped
from vlm_grpo.grpo.training.policy import load_policy
from vlm_grpo.grpo.user_calls import UserCodeError


@dataclass
class RunInputs:
    """What a caller may pass instead of the settings building it, and what runs around the loop."""

    adapter: Any = None  # the policy's adapter (None: loaded from model.init_from / model.name)
    recipe: Any = None
    rewards: Sequence[Any] | None = None  # the run's rewards (None: the settings' or the recipe's)
    after_run: Sequence[Callable[[Path], Any]] = ()  # called with the run directory at the end (api: its pages first)
    step_hooks: Sequence[Callable[[Any, dict], Any]] = ()  # hook(trainer, metrics) after each step; true stops there
    tools: Sequence[Any] = ()  # TRL 1.16's tools, added to the settings' (GRPO)
    environment_factory: Any = None  # TRL 1.16's, replacing the settings' environment (GRPO)
    rollout_func: Callable | None = None  # TRL's rollout_func(prompts, trainer) (GRPO)
    save_each_epoch: bool = False  # a checkpoint at each pass's end (TRL's save_strategy "epoch"), not save_every's
    owner: Any = None  # what step hooks and a rollout_func get as the trainer (None: the stage itself)
    on_begin: Callable[[], Any] | None = None  # before the first step (api: TRL's callbacks, an evaluation on start)
    on_end: Callable[[dict], Any] | None = None  # with the run's summary at its end (api: TRL's on_train_end)
    resume_hint: str = "--resume"  # how this run is continued after a stop, as its messages say (api, experiment)


class Stage:
    stage = "train"  # names the progress bar and is recorded in checkpoints
    dropout = False  # whether the model trains in train() mode (GRPO: no, the ratio compares like with like)
    needs_rewards = True  # GRPO learns from them; SFT's only score held-out evaluations
    evaluates_around = False  # eval.before_after applies (GRPO)

    def __init__(self, cfg: TrainConfig, inputs: RunInputs | None = None):
        self._build(cfg, inputs or RunInputs())

    def _build(self, cfg: TrainConfig, inputs: RunInputs) -> None:
        """Every part, built once in `_assemble` from the validated settings, which stay as they were given."""
        self.cfg = cfg
        self.owner = self if inputs.owner is None else inputs.owner
        self.on_begin, self.on_end = inputs.on_begin, inputs.on_end
        self.after_run = list(inputs.after_run)
        self.step_hooks = list(inputs.step_hooks)
        self.history: list[dict[str, Any]] = []  # this train()'s steps (ctx.log_history: the run's, resumes included)
        self.step = 0
        self.trained = False  # train() runs once per trainer (a second call is refused: see train())
        if inputs.adapter is None:
            check_sources(cfg)  # a model that cannot load is refused before anything else happens
        if cfg.resume_from:  # a run folder or final/ given for a checkpoint: refused before the run folder is made
            check_resume_from(cfg.resume_from, inputs.resume_hint)
        self.ctx = RunContext(cfg, inputs.resume_hint)
        try:
            self._assemble(inputs)
        except BaseException as err:
            self.ctx.release_lock()
            if self.ctx.is_main and isinstance(err, UserCodeError):  # a refusal at the start leaves the folder as it was
                log_failure(self.ctx.run_dir, err)
            raise

    def _assemble(self, inputs: RunInputs) -> None:
        """The one builder, in the order each part needs the ones before it: the run's checkpoints (a --resume's
        settings checked before any model loads), data, saves, the adapter and its checks, the weights that train,
        the stage's parts that read them (GRPO: the reference), the trained policy, evaluation, the stage's step
        parts, and what the checkpoints carry."""
        ctx, cfg = self.ctx, self.cfg
        ctx.open_log()
        self.checkpoints = Checkpoints(ctx, self.stage)  # settings a checkpoint cannot continue with stop here
        if ctx.is_main:  # the resolved settings (a valid --config) and the run's resumes
            safe_files.write_run_file(ctx.run_dir, "config.yaml", to_yaml(cfg, self.checkpoints.history))
        self.data = TrainingData(ctx, inputs.recipe, inputs.rewards, needs_rewards=self.needs_rewards)
        # a checkpoint at each pass's end (TRL's save_strategy "epoch"), else every logging.save_every steps
        self.saves = Saves(ctx, self.checkpoints,
                           save_every=self.steps_per_epoch if inputs.save_each_epoch else cfg.logging.save_every)
        adapter = ready_adapter(inputs.adapter or load_policy(cfg, ctx.device), cfg)
        self.data.check_against(adapter, self.completion_budget())
        check_against_memory(adapter.model, ctx.device, cfg.data.batch_size, self.completions_per_prompt(),
                             self.completion_budget() + 1)  # before the first step, not inside its allocator
        prepare_weights(adapter, cfg)  # what trains is final from here on
        reference = self._assemble_before_policy(adapter)
        self.policy = TrainedPolicy(ctx, adapter, dropout=self.dropout, scheduler_steps=self.scheduler_steps(),
                                    reference=reference)
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

    def _assemble_before_policy(self, adapter) -> Any:
        """The stage's parts that read the final trainable set before the policy is sharded and prepared; returns
        the Reference part sharded with the policy (GRPO: the reference, the vision counter); None: none."""
        return None

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
            start = self.checkpoints.resume()  # 0: no resume, or no checkpoint to resume from
            ctx.trackers.start()
            guards = watchdogs(cfg)
            progress = _progress(start, cfg.max_steps, self.stage, enabled=ctx.is_main and cfg.logging.progress)
            for step in range(start, cfg.max_steps):
                if step > start:  # a signal since the last step's save (its hooks, callbacks): no further step
                    self.saves.before_step(step, stop, progress.close)
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
        if self.on_end is not None:
            self.on_end(summary)
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
                "final/ (as TRL's Trainer does), so it is refused: to train on, build a new trainer on this output_dir "
                "with a larger max_steps and the resume asked for in its settings (resume_from_checkpoint=True in "
                "its GRPOConfig / SFTConfig, --resume on the command line); for a new run, give a new output_dir")
        self.trained = True

    def _begin(self, resume_from_checkpoint) -> dict[str, Any] | None:
        cfg = self.cfg
        if resume_from_checkpoint and not (cfg.resume or cfg.resume_from):  # asked for here, not in the settings
            path = None if isinstance(resume_from_checkpoint, bool) else str(resume_from_checkpoint)
            self.checkpoints.plan(resume=True, resume_from=path)
        try:
            if self.on_begin is not None:
                self.on_begin()
        except BaseException:  # a user's callback failed before the run: the run directory is free again
            self.ctx.release_lock()
            raise
        if not (self.evaluates_around and cfg.eval.before_after):
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
            metrics = self.owner.train_step(step)  # a trainer subclass's own train_step wraps this stage's
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
            return any([hook(self.owner, metrics) for hook in self.step_hooks])
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

    # ---------------------------------------------------------------- what the run's end writes
    @property
    def adapter(self):
        return self.policy.adapter

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


def _progress(start: int, total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc=desc, unit="step", dynamic_ncols=True)
