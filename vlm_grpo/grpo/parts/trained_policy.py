"""The policy as a run trains it: the adapter (prompt settings, generation fields and cache policy applied), LoRA or
the freeze policy, FSDP shards, the per-module-group optimizer and its schedule, prepared by the accelerator; and
how the loop runs a forward on it (sharded or not) and accumulates gradients over micro-batches."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from vlm_grpo.compat.cache_probe import probe_steps
from vlm_grpo.grpo.distributed import fsdp
from vlm_grpo.grpo.training import gradient_checkpointing as checkpointing
from vlm_grpo.adapters.freeze import apply_freeze
from vlm_grpo.grpo.training.lora import apply_lora
from vlm_grpo.grpo.training.optimizer import build_optimizer, build_scheduler, trainable_table, update_step
from vlm_grpo.grpo.training.precision import MasterWeights, stores_bf16, to_bf16
from vlm_grpo.grpo.training.policy import apply_prompt_settings, check_generation_fields
from vlm_grpo.grpo.guards.weight_guard import WeightGuard
from vlm_grpo.loader import apply_cache_policy


def ready_adapter(adapter, cfg) -> Any:
    """The settings' prompt and generation fields on the adapter, and its cache policy (an adapter built by the
    caller is decided as the loader would)."""
    apply_prompt_settings(adapter, cfg)
    check_generation_fields(adapter.model, cfg.generation)
    if adapter.use_cache is None:
        apply_cache_policy(adapter, cfg.model.cache_policy, probe_steps(cfg.generation.max_new_tokens))
    return adapter


def prepare_weights(adapter, cfg) -> None:
    """What trains made final before anything copies or wraps the model: LoRA or the freeze policy, then bf16
    weights (stores_bf16: a reference copied after this is bf16 too)."""
    if cfg.lora.r > 0:
        apply_lora(adapter, cfg.lora, train_fully=cfg.optim.trainable_patterns)
    apply_freeze(adapter, cfg.optim)  # on the wrapped model too
    if stores_bf16(cfg):
        to_bf16(adapter.model)


class TrainedPolicy:
    def __init__(self, ctx, adapter, *, dropout: bool, scheduler_steps: int, reference=None):
        """`adapter`: its weights prepared (prepare_weights); `reference`: the Reference part, sharded with the
        policy under FSDP (None: the stage keeps none)."""
        cfg = ctx.cfg
        self.ctx, self.adapter, self.sharding = ctx, adapter, ctx.sharding
        bf16_weights = stores_bf16(cfg)
        adapter.model.train(dropout)  # GRPO: no dropout, the ratio compares like with like
        if cfg.perf.gradient_checkpointing:
            checkpointing.enable(adapter.model, cfg.perf.gradient_checkpointing_kwargs)
        if self.sharding != "no":  # before the optimizer: it must hold the shards
            root = fsdp.shard(adapter.model, self.sharding)
            if reference is not None:
                reference.shard(self.sharding)
        # float32 masters of the bf16 weights (None: the optimizer steps the weights themselves)
        self.masters = MasterWeights(adapter.model) if bf16_weights else None
        optimizer = build_optimizer(adapter, cfg.optim, self.masters)
        self.scheduler = build_scheduler(optimizer, cfg.optim, total_steps=scheduler_steps)
        acc = ctx.accelerator
        if self.sharding == "no":
            self.model, self.optimizer = acc.prepare(adapter.model, optimizer)
        elif acc.is_fsdp2:  # accelerate's FSDP on GPUs: it takes the sharded root as it is
            self.model, self.optimizer = acc.prepare(root, optimizer)
        else:  # no DDP around a sharded model: the shards' reduce-scatter already averages the gradients
            self.model, self.optimizer = root, acc.prepare(optimizer)
        # every optimizer update is noted, so a failed step knows whether the weights are still the last step's
        self.updated_in_step = False
        inner = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper holds torch's optimizer
        inner.register_step_pre_hook(lambda *_: setattr(self, "updated_in_step", True))
        # every update's weights are checked finite; a step that breaks them is undone (guard.undo_nonfinite_updates)
        self.weight_guard = WeightGuard(self.optimizer, keep_previous=cfg.guard.undo_nonfinite_updates)
        self.undone: dict[str, float] = {}  # the last update's groups whose weights it made non-finite (undone)
        if ctx.is_main:
            print(trainable_table(adapter, cfg.optim))

    @property
    def sharded(self) -> bool:
        return fsdp.is_sharded(self.model)

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
        return fsdp.no_sync(self.model) if self.sharded else self.ctx.accelerator.no_sync(self.model)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters is not None:
            self.masters.clear_weight_gradients()

    def update(self, optim_cfg, step: int | None = None) -> tuple[torch.Tensor, bool]:
        """Clip and apply one optimizer update from the accumulated gradients: (gradient norm, skipped). bf16
        weights: their gradients go onto the float32 masters first, and the updated masters back into them. An
        update that makes a weight non-finite is undone and counts as skipped (`undone` names its groups)."""
        if self.masters is not None:
            self.masters.gradients_in()
        grad_norm, skipped = update_step(self.ctx.accelerator, self.optimizer, optim_cfg)
        self.undone = self.weight_guard.check(step)
        skipped = bool(skipped or self.undone)
        if self.masters is not None and not skipped:
            self.masters.weights_out()
        return grad_norm, skipped

    def skip_reason(self) -> str:
        """Why the last update was skipped, for the step's warning."""
        if self.undone:
            return ("the update made weights non-finite in " + ", ".join(self.undone) + "; undone (weights and "
                    "optimizer state as before the step): lower optim.learning_rate")
        return "non-finite gradient norm, update skipped"

    def learning_rates(self) -> dict[str, float]:
        return {f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups}
