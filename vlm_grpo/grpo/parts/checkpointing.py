"""What a run keeps across a stop: checkpoints, `--resume`, and the final model.

- `save(step)`: an atomic checkpoint (sharded when FSDP shards the policy), carrying the run's history and the
  stage's own state (`extra_state`, `save_extra`).
- `plan()`, at the start of a resumed run, before any model loads: the checkpoint to resume from (verified),
  its settings against the run's (grpo/checkpoint/resume_rules.py: safe changes honoured, meaning-changing ones refused
  unless accepted, each resume recorded in the history). A `--resume` that finds no checkpoint starts over and drops
  what the failed start logged, so metrics never hold two step 1s.
- `resume()`: weights, optimizer, scheduler and RNG state, read as plain data (grpo/safe_loading.py), with the run's
  own hyperparameters (an accepted learning-rate change trains at the new rate, scheduled from the resumed step).
- `save_after_failure(step)`: a step that failed before its first update (a reward error, a bad row) leaves the
  weights of the last completed step: that step is saved, so `--resume` loses nothing.
- `save_final()`: the final model (plus a merged copy under LoRA), gathered from the shards under FSDP.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch

from vlm_grpo.adapters.features import hf_core
from vlm_grpo.adapters.model_dirs import MERGED_DIR
from vlm_grpo.adapters.quantization import is_loaded_in_4bit
from vlm_grpo.grpo.distributed import fsdp, processes
from vlm_grpo.grpo.checkpoint import sharded as shards
from vlm_grpo.grpo.checkpoint import store as ckpt
from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run import process_checks
from vlm_grpo.grpo.safe_files import CreatedFiles
from vlm_grpo.grpo.checkpoint.manifest import verify, write_manifest
from vlm_grpo.grpo.checkpoint.resume_target import check_resume_from
from vlm_grpo.grpo.checkpoint.resume_rules import PROCESSES, check_resume, describe_history, history_entry
from vlm_grpo.grpo.setting_fields import SettingError, resume_policies
from vlm_grpo.grpo.settings.sources import canonical_key, without_trust
from vlm_grpo.grpo.training.lora import apply_lora, is_lora_wrapped, save_merged
from vlm_grpo.grpo.training.policy import load_policy


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))  # as a checkpoint stores it: tuples as lists


class Kept(Protocol):
    """A part's own state in the run's checkpoints: JSON values merged into the run state, and files."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None: ...

    def save_files(self, directory: Path) -> None: ...


class KeptUnder:
    """A part whose state_dict() / load_state_dict(state) travel under one key of the run state (no files)."""

    def __init__(self, key: str, part):
        self.key, self.part = key, part

    def state_dict(self) -> dict[str, Any]:
        return {self.key: self.part.state_dict()}

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        if self.key in state:
            self.part.load_state_dict(state[self.key])

    def save_files(self, directory: Path) -> None:
        pass


class Checkpoints:
    def __init__(self, ctx, stage: str):
        """Plans any `--resume` at once, before a model loads: settings a checkpoint cannot continue with stop here."""
        self.ctx, self.cfg, self.stage = ctx, ctx.cfg, stage
        self.policy = None
        self.kept: list[Kept] = []
        self.on_save: list[Callable[[int], Any]] = []  # told the step of every checkpoint written (TRL's on_save)
        self.plan()

    def attach(self, policy, kept: Sequence[Kept] = ()) -> None:
        """The trained policy, and the parts whose own state the checkpoints carry."""
        self.policy, self.kept = policy, list(kept)

    def _extra_state(self) -> dict[str, Any]:
        return {k: v for part in self.kept for k, v in part.state_dict().items()}

    def _save_files(self, directory: Path) -> None:
        for part in self.kept:
            part.save_files(directory)

    # ---------------------------------------------------------------- saving
    def save(self, step: int) -> Path | None:
        self.ctx.accelerator.wait_for_everyone()
        path = None
        state = {"config": without_trust(self.cfg.to_dict()), "num_processes": self.ctx.accelerator.num_processes, "stage": self.stage,
                 "fsdp": self.ctx.sharding, "history": self.history, "log_history": self.ctx.log_history,
                 **self._extra_state()}
        keep = self.cfg.logging.keep_checkpoints
        if fsdp.is_sharded(self.policy.model):  # every process writes its shard, the main one commits
            if self.ctx.is_main:
                CreatedFiles(self.ctx.run_dir).add(f".tmp-checkpoint-{step}")
            tmp = shards.shared_temp_dir(self.ctx.run_dir, f".tmp-checkpoint-{step}", self.ctx.is_main)
            if self.ctx.is_main:
                CreatedFiles(self.ctx.run_dir).record(tmp.name)
            shards.write_shards(tmp, self.policy.adapter.model, self.policy.optimizer)
            self.ctx.accelerator.wait_for_everyone()
            if self.ctx.is_main:
                self.policy.adapter.processor.save_pretrained(tmp)
                hf_core(self.policy.adapter.model).config.save_pretrained(tmp)
                self._save_files(tmp)
                path = ckpt.commit_checkpoint(tmp, self.ctx.run_dir, step, self.policy.scheduler, state, keep=keep)
        elif self.ctx.is_main:
            path = ckpt.save_checkpoint(self.ctx.run_dir, step, self.policy.adapter, self.policy.optimizer, self.policy.scheduler, state, keep=keep,
                                        extra=self._save_files)
        self.ctx.accelerator.wait_for_everyone()
        for listener in self.on_save:
            listener(step)
        return path

    def save_after_failure(self, step: int, rng_at_start: dict[str, Any]) -> Path | None:
        """Step `step` (0-based) failed: save the `step` steps completed before it when its weights are untouched
        (no update ran) and no checkpoint of them exists. One process only: a failure on one of several processes
        cannot be saved together."""
        if step == 0 or self.policy.updated_in_step or self.ctx.accelerator.num_processes > 1:
            return None
        if (self.ctx.run_dir / f"checkpoint-{step}").is_dir():
            return None
        ckpt.set_rng_state(rng_at_start)  # the state the next step starts from, as a save after the step holds
        try:
            path = self.save(step)
        except Exception as err:  # noqa: BLE001 - the first error is the one to report
            print(f"could not save the last completed step after the failure: {type(err).__name__}: {err}", file=sys.stderr)
            return None
        print(f"checkpoint-{step} saved (the last completed step, before the failure); {self.ctx.resume_hint} continues "
              "from it "
              "once the cause is fixed", file=sys.stderr)
        return path

    # ---------------------------------------------------------------- which checkpoint, and may it be resumed
    def _checkpoint_to_resume(self, resume_from: str | None) -> Path | None:
        """`resume_from`, verified, or the newest checkpoint that verifies (None: the run has none)."""
        if not resume_from:
            return ckpt.latest_good_checkpoint(self.ctx.run_dir)
        latest = check_resume_from(resume_from, self.ctx.resume_hint)
        problems = verify(latest)
        if problems:
            raise SettingError("resume_from", f"{latest}: {'; '.join(problems)}")
        return latest

    def plan(self, resume: bool | None = None, resume_from: str | None = None) -> None:
        """Before any model loads: the checkpoint a `--resume` continues from and the history it extends; refused
        settings raise SettingError. A resume that finds no checkpoint drops the logs of the failed start.
        `resume` / `resume_from`: the settings' unless given (TRL's train(resume_from_checkpoint))."""
        cfg = self.cfg
        resume = cfg.resume if resume is None else resume
        resume_from = resume_from or cfg.resume_from
        self.history, self.resume_point = [], None
        if not (resume or resume_from):
            return
        accept = [_accepted_key(name) for name in cfg.resume_accept]
        self.resume_point = processes.on_main(self.ctx.accelerator, lambda: self._checkpoint_to_resume(resume_from))
        if self.resume_point is None:
            dropped = self.ctx.log.truncate_after(-1)
            if self.ctx.is_main:
                print(f"{self.ctx.resume_hint}: no complete checkpoint in {self.ctx.run_dir}; starting from step 0"
                      + (f" (dropped {dropped} logged steps that no checkpoint holds)" if dropped else ""))
            return
        written_sharded = shards.is_sharded_checkpoint(self.resume_point)
        if written_sharded:  # one shard file per rank: no other process count can read them, accepted or not
            process_checks.check_same_process_count(self.resume_point, self.ctx.accelerator.num_processes)
        if written_sharded != (self.ctx.sharding != "no"):
            written = "an FSDP run" if written_sharded else "a run without FSDP"
            raise SettingError("fsdp", f"{self.resume_point} was written by {written}: resume it with the same fsdp "
                               "setting and process count")
        state = ckpt.read_states(self.resume_point)
        changes = check_resume(state, _plain(cfg.to_dict()), checkpoint=str(self.resume_point), stage=self.stage,
                               policies=resume_policies(cfg),
                               num_processes=self.ctx.accelerator.num_processes, accept=accept)
        self.history = [*state.get("history", []), history_entry(str(self.resume_point), int(state["step"]), changes)]
        if self.ctx.is_main and changes:
            print("\n".join(describe_history(self.history[-1:])))

    # ---------------------------------------------------------------- loading
    def resume(self) -> int:
        latest = self.resume_point
        if latest is None:
            return 0
        sharded = fsdp.is_sharded(self.policy.model)
        fresh = _hyperparameters(self.policy.optimizer, self.policy.scheduler)
        trust = self.cfg.trust_checkpoint
        try:
            if sharded:
                shards.read_shards(latest, self.policy.adapter.model, self.policy.optimizer, trust=trust)
            else:
                ckpt.load_weights(self.policy.adapter.model, latest)
            state = ckpt.load_training_state(latest, None if sharded else self.policy.optimizer, self.policy.scheduler, trust=trust)
            for part in self.kept:
                part.load_state_dict(state, latest)
        except ckpt.UnsafeCheckpointFile:  # its own message: which file, and what would run
            raise
        except Exception as err:  # noqa: BLE001 - a verified checkpoint that still will not load: say which
            raise RuntimeError(f"{latest} verified but cannot be loaded into this run: {type(err).__name__}: {err}") from None
        _restore_hyperparameters(self.policy.optimizer, self.policy.scheduler, fresh)
        self.ctx.log.truncate_after(state["step"])
        self.ctx.log_history = [m for m in state.get("log_history", []) if m.get("step", 0) <= state["step"]]
        if self.ctx.is_main:
            print(f"resumed from {latest} (step {state['step']})")
        return int(state["step"])

    # ---------------------------------------------------------------- the final model
    def save_final(self) -> Path:
        final = self.ctx.run_dir / "final"
        self.ctx.accelerator.wait_for_everyone()
        adapter = self.policy.adapter
        if fsdp.is_sharded(self.policy.model):  # the full weights, gathered once onto the main process, in a plain copy
            full = shards.full_state_dict(self.policy.adapter.model)
            adapter = self._plain_copy(full) if self.ctx.is_main else None
        if self.ctx.is_main:
            tmp = ckpt.staging_dir(self.ctx.run_dir, ".tmp-final")
            with ckpt.resource_errors_say(tmp, self.ctx.run_dir, need=lambda: ckpt.checkpoint_bytes(adapter)):
                ckpt.save_model(adapter, tmp)
                if is_lora_wrapped(adapter) and self.cfg.logging.save_merged:
                    save_merged(self._full_precision_copy(adapter) if is_loaded_in_4bit(adapter.model) else adapter,
                                tmp / MERGED_DIR)
                write_manifest(tmp)
            safe_files.check_path(final)
            created = CreatedFiles(self.ctx.run_dir)
            created.add(final.name)  # refused when the folder there is not the one this run wrote
            safe_files.remove(final)
            tmp.rename(final)
            created.record(final.name)
            created.discard(tmp.name)
        self.ctx.accelerator.wait_for_everyone()
        return final

    def _full_precision_copy(self, adapter):
        """A QLoRA run's policy on a full-precision base (the starting model loaded again without quantization) with
        the run's LoRA weights: merging into the 4-bit base itself would round the merged weights to 4 bits."""
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        cfg = copy.deepcopy(self.cfg)
        cfg.lora.load_in_4bit = False
        full = load_policy(cfg, torch.device("cpu"), decide_cache=False)
        apply_lora(full, cfg.lora, train_fully=cfg.optim.trainable_patterns)
        trained = {k: v.detach().to("cpu", torch.float32) for k, v in get_peft_model_state_dict(adapter.model).items()}
        set_peft_model_state_dict(full.model, trained)
        return full

    def _plain_copy(self, state_dict: dict[str, torch.Tensor]):
        """An unsharded adapter on the CPU holding `state_dict` (the starting model rebuilt, LoRA as in the run)."""
        cfg = self.cfg
        adapter = load_policy(cfg, torch.device("cpu"), decide_cache=False)
        if cfg.lora.r > 0:
            apply_lora(adapter, cfg.lora, train_fully=cfg.optim.trainable_patterns)
        adapter.model.load_state_dict(state_dict, strict=True)
        return adapter


def _accepted_key(name: str) -> str:
    """A `resume_accept` entry as the setting key it names (`learning_rate` -> `optim.learning_rate`)."""
    if name in ("all", PROCESSES):
        return name
    try:
        return canonical_key(name)[0]
    except SettingError as err:
        raise SettingError("resume_accept", f"{name!r}: {err.problem}") from None


def _hyperparameters(optimizer, scheduler) -> dict[str, Any]:
    """The run's own optimizer hyperparameters, as built from its settings (before a checkpoint overwrites them)."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"groups": groups, "base_lrs": list(getattr(scheduler, "base_lrs", []))}


def _restore_hyperparameters(optimizer, scheduler, fresh: dict[str, Any]) -> None:
    """Loading a checkpoint restores its learning rates and AdamW settings; the run's own come back on top, each
    group's rate scheduled at the resumed step. With unchanged settings this recomputes the same values."""
    for group, own in zip(optimizer.param_groups, fresh["groups"]):
        group.update({k: v for k, v in own.items() if k not in ("lr", "initial_lr")})
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not lambdas or not fresh["base_lrs"]:
        return
    scheduler.base_lrs = list(fresh["base_lrs"])
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, lambdas)]
    for group, base, lr in zip(optimizer.param_groups, scheduler.base_lrs, lrs):
        group["initial_lr"], group["lr"] = base, lr
    scheduler._last_lr = lrs  # what get_last_lr() reports
