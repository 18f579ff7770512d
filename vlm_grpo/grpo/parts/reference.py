"""The KL term's reference, decided in one place: none when loss.beta is 0; under LoRA the policy itself with its
adapters switched off; otherwise a frozen in-memory copy of the policy as training starts (never reloaded from
disk by name), which loss.sync_ref_model moves toward the policy every ref_model_sync_steps updates (its weights
then travel in the run's checkpoints). The token scorer and the update ask it; nothing else decides."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Iterator

import torch

from vlm_grpo.grpo.algorithm import reference_sync
from vlm_grpo.grpo.distributed import fsdp
from vlm_grpo.grpo.training.lora import is_lora_wrapped, reference_disabled


class Reference:
    def __init__(self, loss_cfg, adapter):
        """Built once the policy's trainable set is final (LoRA applied, freeze, bf16), before it is sharded."""
        self.adapter = adapter
        self.needed = loss_cfg.beta > 0  # the KL term needs the reference's log-probs
        self.syncs = bool(loss_cfg.sync_ref_model)
        self.sync_steps, self.mixup_alpha = loss_cfg.ref_model_sync_steps, loss_cfg.ref_model_mixup_alpha
        # the frozen copy (None: no KL term, or LoRA's base serves)
        self.model: torch.nn.Module | None = None
        if self.needed and not is_lora_wrapped(adapter):
            self.model = copy.deepcopy(adapter.model).eval().requires_grad_(False)

    def models(self) -> list[torch.nn.Module]:
        """The models of its own that run forwards (the frozen copy, when there is one)."""
        return [] if self.model is None else [self.model]

    def shard(self, mode: str) -> None:
        """Under FSDP, the frozen copy sharded as the policy is."""
        if self.syncs:
            raise ValueError("loss.sync_ref_model with FSDP: the reference's shards are not saved in sharded "
                             "checkpoints yet; train without fsdp, or without sync_ref_model")
        if self.model is not None:
            self.model = fsdp.shard(self.model, mode)

    @contextlib.contextmanager
    def weights(self, policy_model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The model a reference forward runs: the frozen copy, or `policy_model` with LoRA's adapters off."""
        if self.model is not None:
            yield self.model
            return
        with reference_disabled(self.adapter):  # the policy itself (through its wrapper)
            yield policy_model

    # ---------------------------------------------------------------- loss.sync_ref_model
    def after_update(self, updates: int, policy_model: torch.nn.Module) -> None:
        """After the run's `updates`-th optimizer update: the copy moved toward the policy when it is due."""
        if self.syncs and updates % self.sync_steps == 0:
            reference_sync.mix(self.model, policy_model, self.mixup_alpha)

    def save_files(self, directory: Path) -> None:
        if self.syncs:  # the reference has moved away from the starting model: keep it
            reference_sync.save(self.model, directory)

    def load(self, checkpoint: Path) -> None:
        if self.syncs:
            reference_sync.load(self.model, checkpoint)
