"""What every training stage shares (GRPO, SFT warm-up): one place for the run's plumbing.

- the run directory (checked writable before any model is loaded), the accelerator and the seed;
- the recipe's training split and the policy (`model.init_from` wins over `model.name`);
- LoRA or the freeze policy, the per-module-group optimizer and its schedule (grpo/training/optimizer.py, grpo/training/lora.py);
- atomic checkpoints, `--resume`, the final model (plus a merged copy under LoRA), metrics.jsonl;
- the step loop with progress bar, trackers and periodic saves.

A stage subclasses `BaseTrainer` and supplies `train_step(step) -> metrics`; a few class attributes and
hooks say what differs (whether dropout is on, how many scheduler steps a run takes, what the progress
bar shows).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from vlm_grpo.adapters.model_dirs import MERGED_DIR
from vlm_grpo.adapters.features import hf_core
from vlm_grpo.grpo.run import checkpoints as ckpt
from vlm_grpo.grpo.training import gradient_checkpointing as checkpointing
from vlm_grpo.grpo.distributed import fsdp
from vlm_grpo.grpo.distributed import sharded_checkpoints as shards
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.data.order import batch_indices
from vlm_grpo.grpo.data.source import build_split, resolve_recipe
from vlm_grpo.grpo.evaluate import evaluate_run, heldout_split
from vlm_grpo.grpo.training.guards import KLWatchdog, NonFiniteGuard, TrainingHalted, check_disk_space
from vlm_grpo.grpo.run.hub import push_final
from vlm_grpo.grpo.training.lora import apply_lora, is_lora_wrapped, save_merged
from vlm_grpo.grpo.run.manifest import verify, write_manifest
from vlm_grpo.grpo.run.model_card import write_model_card
from vlm_grpo.grpo.training.freeze import apply_freeze
from vlm_grpo.grpo.training.optimizer import build_optimizer, build_scheduler, trainable_table
from vlm_grpo.grpo.training.preflight import cheap_checks, raise_on_failure
from vlm_grpo.grpo.rewards.scoring import run_rewards
from vlm_grpo.grpo.run.directory import prepare_run_dir
from vlm_grpo.grpo.run.logs import RunLog
from vlm_grpo.grpo.run import processes
from vlm_grpo.grpo.settings.sources import check_sources, to_yaml
from vlm_grpo.grpo.run.stop_signals import stop_on_signals
from vlm_grpo.grpo.run.trackers import TRACKER_PROJECT, check_trackers, flat_settings
from vlm_grpo.compat.cache_probe import probe_steps
from vlm_grpo.loader import apply_cache_policy, load_model
from vlm_grpo.recipes.checked import CheckedSource


def load_policy(cfg: TrainConfig, device: torch.device | None = None, decide_cache: bool = True):
    """The adapter of `model.init_from` (a checkpoint to start from) or else `model.name`, on `device`."""
    return load_model(
        cfg.model.init_from or cfg.model.name,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        device=device or cfg.model.device,
        attn_implementation=cfg.model.attn_implementation,
        load_in_4bit=cfg.lora.load_in_4bit,
        trust_remote_code=cfg.model.trust_remote_code,
        allow_pickle_weights=cfg.model.allow_pickle_weights,
        cache_policy=cfg.model.cache_policy,
        probe_steps=probe_steps(cfg.generation.max_new_tokens),
        decide_cache=decide_cache,
    )


PREFLIGHT_SAMPLES = 4  # samples the cheap pre-flight checks encode at the start of a run


class BaseTrainer:
    stage = "train"  # names the progress bar and is recorded in checkpoints
    watch = None  # GRPO's hacking monitors (grpo/training/hacking_watch.py): `.halt` says why to stop after a step
    dropout = False  # whether the model trains in train() mode (GRPO: no, the ratio compares like with like)

    def __init__(self, cfg: TrainConfig, adapter=None, recipe=None, after_run: Sequence[Callable[[Path], Any]] = ()):
        check_sources(cfg)  # a model that cannot load is refused before anything else happens
        check_trackers(cfg.logging.report_to)
        self.cfg = cfg
        self.heldout: dict[str, dict[str, Any]] = {}  # held-out reports by moment (before, after ...), for the card
        self._trackers_started = False
        self.after_run = list(after_run)  # called with the run directory at the end (e.g. the plots the command wires)
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),  # lets torchrun-launched CPU processes form a gloo group
            mixed_precision=cfg.mixed_precision,
            log_with=cfg.logging.report_to or None,
            project_dir=cfg.logging.output_dir,
        )
        set_seed(cfg.seed)
        self.sharding = fsdp.requested_mode(cfg.fsdp, self.accelerator)  # "no", or how FSDP shards the policy
        if self.sharding != "no" and not torch.distributed.is_initialized():
            raise ValueError(f"fsdp {self.sharding} shards across processes: launch with `accelerate launch "
                             "--num_processes N` (or torchrun); one process trains without fsdp")
        self.run_dir = Path(cfg.logging.output_dir)
        if self.is_main:
            prepare_run_dir(self.run_dir, resume=cfg.resume or cfg.resume_from is not None,
                            overwrite=cfg.logging.overwrite_output_dir)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))  # the resolved settings: a valid --config
        processes.check_shared_run_dir(self.run_dir, self.accelerator, cfg.logging.shared_dir_timeout)
        self.recipe = recipe or resolve_recipe(cfg.data.recipe)
        # the run's rewards (data.rewards replace the recipe's), loaded once: scoring, held-out evaluation, card
        self.rewards = run_rewards(self.recipe, cfg.data.rewards, cfg.data.reward_weights)
        self.dataset = CheckedSource(self._build_dataset(), cfg.data.on_bad_sample)
        self.adapter = adapter or load_policy(cfg, self.accelerator.device)
        if self.adapter.use_cache is None:  # an adapter built by the caller: decide as the loader would
            apply_cache_policy(self.adapter, cfg.model.cache_policy, probe_steps(cfg.generation.max_new_tokens))
        if self.is_main:  # the cheap pre-flight checks on the first samples, before any training
            first = [self.dataset[i] for i in range(min(PREFLIGHT_SAMPLES, len(self.dataset)))]
            raise_on_failure(cheap_checks(self.adapter, first, self.completion_budget()))
        self._setup_training()
        if self.is_main:
            check_disk_space(self.run_dir, self.adapter.model)
        self.log = RunLog(self.run_dir, enabled=self.is_main)
        self.step = 0

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

    # A stage's own state in its checkpoints: JSON values for trainer_state.json, files, and both read back.
    def extra_state(self) -> dict[str, Any]:
        return {}

    def save_extra(self, directory: Path) -> None: ...

    def load_extra_state(self, state: dict[str, Any], checkpoint: Path) -> None: ...

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
            checkpointing.enable(adapter.model)
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
        if self.is_main:
            print(trainable_table(adapter, cfg.optim))

    # ---------------------------------------------------------------- data
    def _samples(self, step: int):
        acc = self.accelerator
        idx = batch_indices(len(self.dataset), self.cfg.data.batch_size, step, self.cfg.seed, acc.process_index, acc.num_processes)
        return [self.dataset[i] for i in idx], idx

    def _mean_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.accelerator.num_processes == 1:
            return metrics
        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], device=self.accelerator.device)
        values = self.accelerator.reduce(values, reduction="mean")
        return dict(zip(keys, values.tolist()))

    # ---------------------------------------------------------------- checkpoints
    def save(self, step: int) -> Path | None:
        self.accelerator.wait_for_everyone()
        path = None
        state = {"config": self.cfg.to_dict(), "num_processes": self.accelerator.num_processes, "stage": self.stage,
                 "fsdp": self.sharding, **self.extra_state()}
        keep = self.cfg.logging.keep_checkpoints
        if fsdp.is_sharded(self.model):  # every process writes its shard, the main one commits
            tmp = shards.shared_temp_dir(self.run_dir, f".tmp-checkpoint-{step}", self.is_main)
            shards.write_shards(tmp, self.adapter.model, self.optimizer)
            self.accelerator.wait_for_everyone()
            if self.is_main:
                self.adapter.processor.save_pretrained(tmp)
                hf_core(self.adapter.model).config.save_pretrained(tmp)
                self.save_extra(tmp)
                path = ckpt.commit_checkpoint(tmp, self.run_dir, step, self.scheduler, state, keep=keep)
        elif self.is_main:
            path = ckpt.save_checkpoint(self.run_dir, step, self.adapter, self.optimizer, self.scheduler, state, keep=keep,
                                        extra=self.save_extra)
        self.accelerator.wait_for_everyone()
        return path

    def _checkpoint_to_resume(self) -> Path | None:
        """`resume_from`, verified, or the newest checkpoint that verifies (None: the run has none)."""
        if not self.cfg.resume_from:
            return ckpt.latest_good_checkpoint(self.run_dir)
        latest = Path(self.cfg.resume_from)
        problems = verify(latest) if latest.is_dir() else ["no such checkpoint directory"]
        if problems:
            raise RuntimeError(f"resume_from {latest}: {'; '.join(problems)}")
        return latest

    def resume(self) -> int:
        latest = processes.on_main(self.accelerator, self._checkpoint_to_resume)
        if latest is None:
            if self.is_main:
                print(f"--resume: no complete checkpoint in {self.run_dir}; starting from step 0")
            return 0
        processes.check_same_process_count(latest, self.accelerator.num_processes)
        sharded = fsdp.is_sharded(self.model)
        if shards.is_sharded_checkpoint(latest) != sharded:
            written = "an FSDP run" if not sharded else "a run without FSDP"
            raise RuntimeError(f"{latest} was written by {written}: resume it with the same fsdp setting and process count")
        trust = self.cfg.trust_checkpoint
        try:
            if sharded:
                shards.read_shards(latest, self.adapter.model, self.optimizer, trust=trust)
            else:
                ckpt.load_weights(self.adapter.model, latest)
            state = ckpt.load_training_state(latest, None if sharded else self.optimizer, self.scheduler, trust=trust)
            self.load_extra_state(state, latest)
        except ckpt.UnsafeCheckpointFile:  # its own message: which file, and what would run
            raise
        except Exception as err:  # noqa: BLE001 - a verified checkpoint that still will not load: say which
            raise RuntimeError(f"{latest} verified but cannot be loaded into this run: {type(err).__name__}: {err}") from None
        self.log.truncate_after(state["step"])
        if self.is_main:
            print(f"resumed from {latest} (step {state['step']})")
        return int(state["step"])

    def save_final(self) -> Path:
        final = self.run_dir / "final"
        self.accelerator.wait_for_everyone()
        adapter = self.adapter
        if fsdp.is_sharded(self.model):  # the full weights, gathered once onto the main process, in a plain copy
            full = shards.full_state_dict(self.adapter.model)
            adapter = self._plain_copy(full) if self.is_main else None
        if self.is_main:
            tmp = self.run_dir / ".tmp-final"
            shutil.rmtree(tmp, ignore_errors=True)
            ckpt.save_model(adapter, tmp)
            if is_lora_wrapped(adapter) and self.cfg.logging.save_merged:
                save_merged(adapter, tmp / MERGED_DIR)
            write_manifest(tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        self.accelerator.wait_for_everyone()
        return final

    def _plain_copy(self, state_dict: dict[str, torch.Tensor]):
        """An unsharded adapter on the CPU holding `state_dict` (the starting model rebuilt, LoRA as in the run)."""
        cfg = self.cfg
        adapter = load_policy(cfg, torch.device("cpu"), decide_cache=False)
        if cfg.lora.r > 0:
            apply_lora(adapter, cfg.lora, train_fully=cfg.optim.trainable_patterns)
        adapter.model.load_state_dict(state_dict, strict=True)
        return adapter

    # ---------------------------------------------------------------- trackers, card, hub
    def start_trackers(self) -> None:
        """accelerate's trackers (logging.report_to), started once per run."""
        if self.cfg.logging.report_to and not self._trackers_started:
            flat = {k: str(v) for k, v in flat_settings(self.cfg.to_dict()).items()}
            name = self.cfg.logging.run_name
            kwargs = {"wandb": {"name": name}, "mlflow": {"run_name": name}} if name else {}
            self.accelerator.init_trackers(TRACKER_PROJECT, config=flat, init_kwargs=kwargs)
            self._trackers_started = True

    def track(self, metrics: dict[str, Any], step: int) -> None:
        if self._trackers_started:
            self.accelerator.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def finish(self) -> None:
        """After the final model is saved: its model card (with any held-out results), the hub push, the trackers."""
        final = self.run_dir / "final"
        if self.is_main and final.is_dir():
            logging_cfg = self.cfg.logging
            title = logging_cfg.hub_model_id or self.run_dir.resolve().name
            card = write_model_card(final, self.run_dir, self.cfg, stage=self.stage, family=self.adapter.family,
                                    rewards=self.rewards, heldout=self.heldout, title=title)
            write_manifest(final, changed=card)  # the weights were hashed by save_final
            if logging_cfg.push_to_hub:
                url = push_final(final, title, private=logging_cfg.hub_private)
                print(f"pushed {final} to {url}")
        if self._trackers_started:
            self.accelerator.end_training()

    # ---------------------------------------------------------------- the loop
    def train(self, finish: bool = True) -> list[dict[str, Any]]:
        """The step loop; `finish=False` leaves the model card, push and trackers to the caller (GRPO's held-out
        evaluation after the run comes first)."""
        cfg = self.cfg
        start = self.resume() if cfg.resume or cfg.resume_from else 0
        self.start_trackers()
        nonfinite, kl_watch = NonFiniteGuard(cfg.guard.max_nonfinite_steps), KLWatchdog(cfg.guard)
        history = []
        progress = _progress(start, cfg.max_steps, self.stage, enabled=self.is_main and cfg.logging.progress)
        with stop_on_signals() as stop:
            for step in range(start, cfg.max_steps):
                started = time.perf_counter()
                metrics = self.train_step(step)
                metrics.setdefault("step", step + 1)
                metrics.setdefault("step_time", time.perf_counter() - started)
                metrics["skipped_samples"] = len(self.dataset.skipped)
                history.append(metrics)
                self.log.metrics(metrics)
                self.track(metrics, metrics["step"])
                progress.update(1)
                progress.set_postfix(self.progress_postfix(metrics))
                # A guard that trips raises before this step is saved: the newest checkpoint stays the last good one.
                nonfinite.observe(metrics)
                kl_watch.observe(metrics)
                done = step + 1
                if self.watch is not None and self.watch.halt:  # guard.on_hacking stop: this step saved, then stop
                    self.save(done)
                    raise TrainingHalted(f"{self.watch.halt}; checkpoint-{done} saved, stopped (guard.on_hacking stop)")
                if stop.signum is not None:
                    self.save(done)
                    progress.close()
                    if self.is_main:
                        print(f"\n{signal.Signals(stop.signum).name}: checkpoint-{done} saved in {self.run_dir}; --resume continues")
                    return history
                if cfg.logging.save_every and done % cfg.logging.save_every == 0 and done < cfg.max_steps:
                    self.save(done)
        progress.close()
        if start < cfg.max_steps or not ckpt.latest_checkpoint(self.run_dir):
            self.save(cfg.max_steps)
        self.save_final()
        if self.dataset.skipped and self.is_main:
            print(f"skipped {len(self.dataset.skipped)} bad samples: {list(self.dataset.skipped)}")
        self.run_after_hooks()
        if finish:
            self.finish()
        return history

    def run_after_hooks(self) -> None:
        if self.is_main:
            for hook in self.after_run:
                hook(self.run_dir)


def _progress(start: int, total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc=desc, unit="step", dynamic_ncols=True)
