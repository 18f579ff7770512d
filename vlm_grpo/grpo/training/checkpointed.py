"""What a stage keeps across a stop: its checkpoints (atomic, verified on resume), resuming from one, and the final
model (plus a merged copy under LoRA), for plain and FSDP-sharded policies alike. A mixin of BaseTrainer: it reads
the trainer's accelerator, run directory, model, optimizer and scheduler."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch

from vlm_grpo.adapters.features import hf_core
from vlm_grpo.adapters.model_dirs import MERGED_DIR
from vlm_grpo.adapters.quantization import is_loaded_in_4bit
from vlm_grpo.grpo.distributed import fsdp, processes
from vlm_grpo.grpo.distributed import sharded_checkpoints as shards
from vlm_grpo.grpo.run import checkpoints as ckpt
from vlm_grpo.grpo.run import process_checks
from vlm_grpo.grpo.run.manifest import verify, write_manifest
from vlm_grpo.grpo.training.lora import apply_lora, is_lora_wrapped, save_merged
from vlm_grpo.grpo.training.policy import load_policy


class Checkpointed:
    # A stage's own state in its checkpoints: JSON values for trainer_state.json, files, and both read back.
    def extra_state(self) -> dict[str, Any]:
        return {}

    def save_extra(self, directory: Path) -> None: ...

    def load_extra_state(self, state: dict[str, Any], checkpoint: Path) -> None: ...

    # ---------------------------------------------------------------- checkpoints
    def save(self, step: int) -> Path | None:
        self.accelerator.wait_for_everyone()
        path = None
        state = {"config": self.cfg.to_dict(), "num_processes": self.accelerator.num_processes, "stage": self.stage,
                 "fsdp": self.sharding, "log_history": self.log_history, **self.extra_state()}
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
        process_checks.check_same_process_count(latest, self.accelerator.num_processes)
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
        self.log_history = [m for m in state["log_history"] if m.get("step", 0) <= state["step"]]
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
                save_merged(self._full_precision_copy(adapter) if is_loaded_in_4bit(adapter.model) else adapter,
                            tmp / MERGED_DIR)
            write_manifest(tmp)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        self.accelerator.wait_for_everyone()
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

