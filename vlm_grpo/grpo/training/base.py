"""What every training stage shares (GRPO, SFT warm-up): one place for the run's plumbing.

- the run directory (locked for the run, checked writable before any model is loaded), the accelerator and the seed;
- the recipe's training split, every sample checked when drawn, and the policy (`model.init_from` wins over `model.name`);
- LoRA or the freeze policy, the per-module-group optimizer and its schedule (grpo/training/optimizer.py, grpo/training/lora.py);
- atomic checkpoints, `--resume` and the final model (grpo/training/checkpointed.py), metrics.jsonl;
- the step loop with progress bar, trackers, periodic saves, watchdogs and clean stops: a signal saves the step and
  raises StopSignal (exit 130/143), a step that fails before its update saves the last completed one.

A stage subclasses `BaseTrainer` and supplies `train_step(step) -> metrics`; a few class attributes and
hooks say what differs (whether dropout is on, how many scheduler steps a run takes, what the progress
bar shows).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from vlm_grpo.grpo.interrupts import StopSignal
from vlm_grpo.grpo.user_calls import UserCodeError
from vlm_grpo.grpo.run import checkpoints as ckpt
from vlm_grpo.grpo.training import gradient_checkpointing as checkpointing
from vlm_grpo.grpo.distributed import fsdp
from vlm_grpo.grpo.distributed import processes
from vlm_grpo.grpo.settings.fields import SettingError
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.data.order import batch_indices, epoch_steps, repeats_note
from vlm_grpo.grpo.data.source import build_split, resolve_recipe
from vlm_grpo.grpo.evaluate import evaluate_run, heldout_split, run_rewards_of
from vlm_grpo.grpo.training.guards import KLWatchdog, LearningSignalMonitor, NonFiniteGuard, TrainingHalted, check_disk_space
from vlm_grpo.grpo.run.hub import push_final
from vlm_grpo.grpo.training.lora import apply_lora, is_lora_wrapped
from vlm_grpo.grpo.run.manifest import write_manifest
from vlm_grpo.grpo.run.model_card import write_model_card
from vlm_grpo.grpo.training.freeze import apply_freeze
from vlm_grpo.grpo.training.optimizer import build_optimizer, build_scheduler, trainable_table
from vlm_grpo.grpo.training.preflight import cheap_checks, check_drawn_sample, check_mixed_precision, raise_on_failure
from vlm_grpo.grpo.run.directory import prepare_run_dir
from vlm_grpo.grpo.training.checkpointed import Checkpointed
from vlm_grpo.grpo.training.policy import apply_prompt_settings, check_generation_fields, load_policy
from vlm_grpo.grpo.run.logs import RunLog, log_failure
from vlm_grpo.grpo.run import process_checks, safe_files
from vlm_grpo.grpo.settings.sources import check_sources, to_yaml
from vlm_grpo.grpo.run.stop_signals import stop_on_signals
from vlm_grpo.grpo.run.run_trackers import RunTrackers
from vlm_grpo.grpo.run.trackers import check_trackers
from vlm_grpo.compat.cache_probe import probe_steps
from vlm_grpo.loader import apply_cache_policy
from vlm_grpo.recipes.checked import CheckedSource

__all__ = ["BaseTrainer", "load_policy"]


PREFLIGHT_SAMPLES = 4  # samples the cheap pre-flight checks encode at the start of a run


class BaseTrainer(Checkpointed):
    stage = "train"  # names the progress bar and is recorded in checkpoints
    watch = None  # GRPO's hacking monitors (grpo/training/hacking_watch.py): `.halt` says why to stop after a step
    watch = None  # GRPO's hacking monitors (grpo/training/hacking_watch.py): `.halt` says why to stop after a step
    dropout = False  # whether the model trains in train() mode (GRPO: no, the ratio compares like with like)
    needs_rewards = True  # GRPO learns from them; SFT's only score held-out evaluations

    def __init__(self, cfg: TrainConfig, adapter=None, recipe=None, after_run: Sequence[Callable[[Path], Any]] = (), *,
                 rewards: Sequence[Any] | None = None, step_hooks: Sequence[Callable[["BaseTrainer", dict], Any]] = ()):
        """`adapter`, `recipe`, `rewards`: built by the caller (the Python API) instead of from the settings;
        `step_hooks`: called as hook(trainer, metrics) after each step, a true result stops the run there."""
        if adapter is None:
            check_sources(cfg)  # a model that cannot load is refused before anything else happens
        check_trackers(cfg.logging.report_to)
        check_mixed_precision(cfg.mixed_precision, cfg.model.device)
        self.cfg = cfg
        self.step_hooks = list(step_hooks)
        self.log_history: list[dict[str, Any]] = []  # every step's metrics, for trainer_state.json
        self.heldout: dict[str, dict[str, Any]] = {}  # held-out reports by moment (before, after ...), for the card
        self.after_run = list(after_run)  # called with the run directory at the end (e.g. the plots the command wires)
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),  # lets torchrun-launched CPU processes form a gloo group
            mixed_precision=cfg.mixed_precision,
            log_with=cfg.logging.report_to or None,
            project_dir=cfg.logging.output_dir,
        )
        set_seed(cfg.seed)
        if cfg.perf.full_determinism:  # TRL's full_determinism: transformers' own switch (seeds, deterministic kernels)
            from transformers import enable_full_determinism

            enable_full_determinism(cfg.seed)
        self.sharding = fsdp.requested_mode(cfg.fsdp, self.accelerator)  # "no", or how FSDP shards the policy
        if self.sharding != "no" and not torch.distributed.is_initialized():
            raise SettingError("fsdp", f"{self.sharding} shards across processes: launch with `accelerate launch "
                               "--num_processes N` (or torchrun); one process trains without fsdp")
        self.run_dir = Path(cfg.logging.output_dir)
        self.trackers = RunTrackers(self.accelerator, cfg, self.run_dir, self.is_main)
        self.lock = None  # the run directory's lock, held by the main process until the run ends
        if self.is_main:
            self.lock = prepare_run_dir(self.run_dir, resume=cfg.resume or cfg.resume_from is not None,
                                        overwrite=cfg.logging.overwrite_output_dir)
        try:
            self._start(adapter, recipe, rewards)
        except BaseException as err:
            self.release_lock()
            if self.is_main and isinstance(err, UserCodeError):  # a refusal at the start leaves the folder as it was
                log_failure(self.run_dir, err)
            raise

    def _start(self, adapter, recipe, rewards) -> None:
        cfg = self.cfg
        process_checks.check_shared_run_dir(self.run_dir, self.accelerator, cfg.logging.shared_dir_timeout)
        self.log = RunLog(self.run_dir, enabled=self.is_main)
        self.plan_resume()  # before any model loads: settings a checkpoint cannot continue with stop here
        if self.is_main:  # the resolved settings (a valid --config) and the run's resumes
            safe_files.write_run_file(self.run_dir, "config.yaml", to_yaml(cfg, self.run_history))
        self.recipe = recipe or resolve_recipe(cfg.data.recipe)
        # the run's rewards (data.rewards replace the recipe's), loaded once: scoring, held-out evaluation, card
        self.rewards = list(rewards) if rewards is not None else run_rewards_of(
            self.recipe, cfg, self.accelerator.device, required=self.needs_rewards)
        self.dataset = CheckedSource(self._build_dataset(), cfg.data.on_bad_sample)
        if cfg.epochs > 0:  # the run's length in passes over the split (TRL's num_train_epochs with max_steps -1)
            cfg.max_steps = epoch_steps(cfg.epochs, len(self.dataset), cfg.data.batch_size * self.accelerator.num_processes)
        note = repeats_note(len(self.dataset), cfg.data.batch_size * self.accelerator.num_processes)
        if note and self.is_main:
            print(note)
        self.adapter = adapter or load_policy(cfg, self.accelerator.device)
        self.dataset.for_adapter(self.adapter)  # a video row for a model that reads no video is a bad row
        apply_prompt_settings(self.adapter, cfg)
        check_generation_fields(self.adapter.model, cfg.generation)
        if self.adapter.use_cache is None:  # an adapter built by the caller: decide as the loader would
            apply_cache_policy(self.adapter, cfg.model.cache_policy, probe_steps(cfg.generation.max_new_tokens))
        # every sample is checked against the model the first time it is drawn (encodes, fits the positions); in
        # skip mode from the start, so bad first samples are skipped rather than failing the pre-flight checks
        check = functools.partial(check_drawn_sample, self.adapter, max_new_tokens=self.completion_budget())
        if cfg.data.on_bad_sample == "skip":
            self.dataset.check_drawn = check
        if self.is_main:  # the cheap pre-flight checks on the first samples, before any training
            first = [self.dataset[i] for i in range(min(PREFLIGHT_SAMPLES, len(self.dataset)))]
            raise_on_failure(cheap_checks(self.adapter, first, self.completion_budget()))
        self.dataset.check_drawn = check
        self._setup_training()
        if self.is_main:
            check_disk_space(self.run_dir, self.adapter.model)
        self.step = 0

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def _build_dataset(self):
        cfg = self.cfg
        return build_split(self.recipe, cfg.data, "train", cfg.data.train_size, cfg.seed)

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    # ---------------------------------------------------------------- hooks
    def _after_freeze(self) -> None:
        """Runs once the trainable set is final, before the optimizer is built (GRPO: reference copy)."""

    @functools.cached_property
    def heldout_data(self):
        """The held-out samples, built once for every evaluation of the run."""
        return heldout_split(self.recipe, self.cfg)

    def evaluate(self, step: int) -> dict[str, Any]:
        """The run's greedy held-out evaluation at `step` (on the policy's full weights when sharded)."""
        return self.with_full_weights(lambda: evaluate_run(self.adapter, self.recipe, self.cfg, rewards=self.rewards,
                                                           step=step, dataset=self.heldout_data))

    def completion_budget(self) -> int:
        """Tokens a completion may take (for the sequence-budget check)."""
        return self.cfg.generation.max_new_tokens

    def scheduler_steps(self) -> int:
        return self.cfg.max_steps

    def progress_postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"loss": f"{metrics.get('loss', float('nan')):.4f}"}

    def train_step(self, step: int) -> dict[str, Any]:
        raise NotImplementedError

    def _shard_more(self) -> None:
        """Under FSDP, shards whatever else the stage keeps (GRPO: its reference copy)."""

    # ---------------------------------------------------------------- running the model
    def forward(self, fn: Callable[[torch.nn.Module], Any], model: torch.nn.Module | None = None) -> Any:
        """`fn(model)` (default: the prepared policy); a sharded model runs it inside its root unit's forward."""
        return fsdp.run(self.model if model is None else model, fn)

    def with_full_weights(self, fn: Callable[[], Any]) -> Any:
        """`fn()` with the policy's full weights in place (generation, evaluation): a no-op unless sharded."""
        with fsdp.gathered(self.model):
            return self.forward(lambda _model: fn())

    def accumulating(self, last: bool):
        """Around a micro-batch's backward: gradients stay local until the last one of the update."""
        if last:
            return contextlib.nullcontext()
        return fsdp.no_sync(self.model) if fsdp.is_sharded(self.model) else self.accelerator.no_sync(self.model)

    # ---------------------------------------------------------------- setup
    def _setup_training(self) -> None:
        cfg, adapter = self.cfg, self.adapter
        if cfg.lora.r > 0:
            apply_lora(adapter, cfg.lora, train_fully=cfg.optim.trainable_patterns)
        apply_freeze(adapter, cfg.optim)  # on the wrapped model too: what trains is final before _after_freeze
        self._after_freeze()
        adapter.model.train(self.dropout)
        if cfg.perf.gradient_checkpointing:
            checkpointing.enable(adapter.model, cfg.perf.gradient_checkpointing_kwargs)
        if self.sharding != "no":  # before the optimizer: it must hold the shards
            root = fsdp.shard(adapter.model, self.sharding)
            self._shard_more()
        optimizer = build_optimizer(adapter, cfg.optim)
        self.scheduler = build_scheduler(optimizer, cfg.optim, total_steps=self.scheduler_steps())
        if self.sharding == "no":
            self.model, self.optimizer = self.accelerator.prepare(adapter.model, optimizer)
        elif self.accelerator.is_fsdp2:  # accelerate's FSDP on GPUs: it takes the sharded root as it is
            self.model, self.optimizer = self.accelerator.prepare(root, optimizer)
        else:  # no DDP around a sharded model: the shards' reduce-scatter already averages the gradients
            self.model, self.optimizer = root, self.accelerator.prepare(optimizer)
        self.watch_updates()
        if self.is_main:
            print(trainable_table(adapter, cfg.optim))

    # ---------------------------------------------------------------- data
    def _samples(self, step: int):
        acc = self.accelerator
        data = self.cfg.data
        seed = self.cfg.seed if data.data_seed is None else data.data_seed
        idx = batch_indices(len(self.dataset), data.batch_size, step, seed, acc.process_index, acc.num_processes,
                            shuffle=data.shuffle)
        picked = [self.dataset.pick(i) for i in idx]  # in skip mode a bad sample's place goes to the next good one
        return [sample for _, sample in picked], [i for i, _ in picked]

    def _mean_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        return processes.mean_over_processes(self.accelerator, metrics)

    # ---------------------------------------------------------------- trackers, card, hub
    def write_card(self, folder: Path | None = None, title: str | None = None) -> str:
        """The model card (with any held-out results) in `folder` (default final/), its manifest brought up to
        date; returns the title it carries."""
        folder = folder or self.run_dir / "final"
        title = title or self.cfg.logging.hub_model_id or self.run_dir.resolve().name
        card = write_model_card(folder, self.run_dir, self.cfg, stage=self.stage, family=self.adapter.family,
                                rewards=self.rewards, heldout=self.heldout, title=title, lora=is_lora_wrapped(self.adapter),
                                history=self.run_history)
        write_manifest(folder, changed=card)  # the weights were hashed when they were saved
        return title

    def finish(self) -> None:
        """After the final model is saved: its model card (with any held-out results), the hub push, the trackers."""
        final = self.run_dir / "final"
        if self.is_main and final.is_dir():
            title = self.write_card(final)
            if self.cfg.logging.push_to_hub:
                url = push_final(final, title, private=self.cfg.logging.hub_private)
                print(f"pushed {final} to {url}")
        self.trackers.end()
        self.release_lock()

    # ---------------------------------------------------------------- the loop
    def train(self, finish: bool = True) -> list[dict[str, Any]]:
        """The step loop; `finish=False` leaves the model card, push and trackers to the caller (GRPO's held-out
        evaluation after the run comes first). SIGINT/SIGTERM: the step finishes, is saved, and StopSignal is raised."""
        try:
            with stop_on_signals() as stop:
                history = self._loop(stop)
                with stop.saving_checkpoint():
                    # the last step run (a step hook may have stopped the run early)
                    last = history[-1]["step"] if history else self.cfg.max_steps
                    if self.cfg.logging.checkpoint_at_end and (history or not ckpt.latest_checkpoint(self.run_dir)):
                        self.save(last)
                    self.save_final()
                signum = self._agreed_stop(stop)
                if signum:
                    self._stopped(signum, last, "final/ is saved too; ")
        except StopSignal as err:
            self.release_lock()
            if err.at_once:
                newest = ckpt.latest_checkpoint(self.run_dir)
                raise StopSignal(err.signum, f"{err.message} during step {self.step + 1}; not saved: the newest "
                                 f"checkpoint is {newest.name if newest else 'none'}; --resume continues from it") from None
            raise
        except BaseException as err:
            self.release_lock()
            if self.is_main:
                log_failure(self.run_dir, err)  # the full traceback; the message says one line
            raise
        if self.dataset.skipped and self.is_main:
            print(f"skipped {len(self.dataset.skipped)} bad samples: {list(self.dataset.skipped)}")
        self.run_after_hooks()
        if finish:
            self.finish()
        return history

    def _loop(self, stop) -> list[dict[str, Any]]:
        cfg = self.cfg
        self.start = self.resume() if cfg.resume or cfg.resume_from else 0
        self.trackers.start()
        watchdogs = [NonFiniteGuard(cfg.guard.max_nonfinite_steps), KLWatchdog(cfg.guard),
                     LearningSignalMonitor(cfg.generation.temperature)]
        history = []
        progress = _progress(self.start, cfg.max_steps, self.stage, enabled=self.is_main and cfg.logging.progress)
        for step in range(self.start, cfg.max_steps):
            self.step, self.updated_in_step = step, False
            started, rng_at_start = time.perf_counter(), ckpt.rng_state()
            try:
                metrics = self.train_step(step)
            except Exception:
                self.save_after_failure(step, rng_at_start)
                raise
            metrics.setdefault("step", step + 1)
            metrics.setdefault("step_time", time.perf_counter() - started)
            metrics["skipped_samples"] = len(self.dataset.skipped)
            history.append(metrics)
            self.log_history.append(metrics)
            self.log.metrics(metrics)
            self.trackers.metrics(metrics, metrics["step"])
            progress.update(1)
            progress.set_postfix(self.progress_postfix(metrics))
            # A guard that trips raises before this step is saved: the newest checkpoint stays the last good one.
            for watchdog in watchdogs:
                watchdog.observe(metrics)
            done, signum = step + 1, self._agreed_stop(stop)
            if self.watch is not None and self.watch.halt:  # guard.on_hacking stop: this step saved, then stop
                with stop.saving_checkpoint():
                    self.save(done)
                raise TrainingHalted(f"{self.watch.halt}; checkpoint-{done} saved, stopped (guard.on_hacking stop)")
            periodic = cfg.logging.save_every and done % cfg.logging.save_every == 0 and done < cfg.max_steps
            if periodic or (signum and done < cfg.max_steps):
                with stop.saving_checkpoint():
                    self.save(done)
            if signum and done < cfg.max_steps:
                progress.close()
                self._stopped(signum, done)
            try:
                stop_here = any([hook(self, metrics) for hook in self.step_hooks])  # every hook sees every step
            except Exception:  # a user's callback failed after the step: the step is kept
                self._save_completed(done, stop)
                raise
            if stop_here:
                break
        progress.close()
        return history

    def _save_completed(self, done: int, stop) -> None:
        if self.accelerator.num_processes > 1 or (self.run_dir / f"checkpoint-{done}").is_dir():
            return
        with stop.saving_checkpoint():
            self.save(done)
        print(f"checkpoint-{done} saved (the last completed step, before the failure); --resume continues from it "
              "once the cause is fixed", file=sys.stderr)

    def _agreed_stop(self, stop) -> int:
        """The signal received by this process or any other (0: none): all stop at the same step, since saving is
        collective."""
        if self.accelerator.num_processes == 1:
            return stop.signum or 0
        received = torch.tensor([stop.signum or 0], device=self.accelerator.device)
        return int(self.accelerator.gather(received).max())

    def _stopped(self, signum: int, step: int, also: str = "") -> None:
        name = StopSignal(signum, "").name
        raise StopSignal(signum, f"stopped at step {step} by {name}; checkpoint-{step} saved in {self.run_dir}; "
                         f"{also}--resume continues")

    def run_after_hooks(self) -> None:
        if self.is_main:
            for hook in self.after_run:
                hook(self.run_dir)


def _progress(start: int, total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc=desc, unit="step", dynamic_ncols=True)
