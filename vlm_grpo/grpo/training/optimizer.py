"""Per-module learning rates, the optimizer, its schedule and the update (clipping, non-finite skips).

Everything here derives from one declaration: the adapter's module groups (`vision`, `projector`,
`language`, `head`; see `VLMAdapter.module_patterns`), with a mixture-of-experts model's routers and experts as
the `experts` sub-group of `language` (its own optimizer group and row, `experts_lr` defaulting to the language
model's). So a learning-rate split written once works on every family, and keeps working after LoRA wrapping (a
LoRA matrix belongs to the group of the layer it adapts).
Which parameters train at all is the freeze policy's job (freeze.py).
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from vlm_grpo.adapters.module_groups import GROUP_NAMES, MODULE_GROUPS, SUB_GROUPS
from vlm_grpo.grpo.distributed.fsdp import full_tensor
from vlm_grpo.grpo.settings.sections import OptimConfig
from vlm_grpo.adapters.freeze import apply_freeze

# ---------------------------------------------------------------- optimizer
def param_groups(adapter, cfg: OptimConfig) -> list[dict]:
    """One optimizer group per module group (sub-groups apart) with trainable parameters (current `requires_grad`)."""
    by_group: dict[str, list[torch.nn.Parameter]] = {g: [] for g in GROUP_NAMES}
    has_experts = False
    for name, param in adapter.model.named_parameters():
        group = adapter.training_group_of(name)
        has_experts = has_experts or group == "experts"
        if param.requires_grad:
            by_group[group].append(param)
    if cfg.experts_lr is not None and not has_experts:
        raise ValueError(f"experts_lr is set, but {adapter.family} is not a mixture-of-experts model: it has no "
                         "router or expert parameters")
    groups = [
        {"name": g, "params": params, "lr": cfg.lr_for(g), "weight_decay": cfg.weight_decay}
        for g, params in by_group.items()
        if params
    ]
    if not groups:
        raise ValueError(f"no trainable parameter left in {adapter.family}: the freeze policy froze everything")
    return groups


def build_optimizer(adapter, cfg: OptimConfig, masters=None) -> torch.optim.Optimizer:
    """Apply the freeze policy, then the optimizer (AdamW by default) over the per-module-group parameter groups;
    with `masters` (training/precision.py MasterWeights) it steps their float32 masters of the bf16 weights."""
    apply_freeze(adapter, cfg)
    groups = param_groups(adapter, cfg)
    if masters is not None:
        groups = masters.param_groups(groups)
    if cfg.optimizer == "adamw_torch":
        return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=cfg.adam_betas, eps=cfg.adam_eps,
                                 weight_decay=cfg.weight_decay)
    cls, kwargs = optimizer_class(cfg)
    return cls(groups, **kwargs)


def optimizer_class(cfg: OptimConfig) -> tuple[type, dict]:
    """(class, keyword arguments) of `cfg.optimizer` as transformers' Trainer builds the optimizer of that name."""
    from types import SimpleNamespace

    from transformers import Trainer

    args = SimpleNamespace(optim=cfg.optimizer, optim_args=None, learning_rate=cfg.learning_rate,
                           adam_beta1=cfg.adam_betas[0], adam_beta2=cfg.adam_betas[1], adam_epsilon=cfg.adam_eps)
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    return cls, {**kwargs, "weight_decay": cfg.weight_decay}


def warmup_steps_for(cfg: OptimConfig, total_steps: int) -> int:
    if cfg.warmup_steps > 0:
        return cfg.warmup_steps
    return math.ceil(cfg.warmup_ratio * total_steps)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int):
    """transformers' named schedule; it scales each group's own lr, so the per-module ratios hold."""
    from transformers import get_scheduler

    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    return get_scheduler(
        cfg.lr_scheduler, optimizer, num_warmup_steps=warmup_steps_for(cfg, total_steps), num_training_steps=total_steps,
        scheduler_specific_kwargs=cfg.lr_scheduler_kwargs or None,
    )


def clip_gradients(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> torch.Tensor:
    """Clip the optimizer's gradients to `max_grad_norm` (<= 0: only measure); returns the total norm."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


def update_step(accelerator, optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> tuple[torch.Tensor, bool]:
    """Clip and apply one update; returns (gradient norm, skipped).

    Clipping goes through the accelerator, which unscales fp16 gradients first (clipping scaled gradients would
    clip by the wrong norm). With a loss scaler the optimizer step always runs: the scaler itself skips an
    update whose gradients overflowed and lowers its scale, which skipping its step would never let happen.
    Without one, a non-finite gradient norm skips the update here, weights untouched.
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not params:
        return torch.tensor(0.0), False
    if any(isinstance(p, DTensor) for p in params):  # FSDP shards: torch's clipping reduces the norm over them
        accelerator.unscale_gradients()
        grad_norm = full_tensor(clip_gradients(optimizer, cfg))
    else:
        grad_norm = accelerator.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
    if getattr(optimizer, "scaler", None) is not None:
        optimizer.step()
        return grad_norm, bool(accelerator.optimizer_step_was_skipped)
    if not torch.isfinite(torch.as_tensor(grad_norm)).item():
        return grad_norm, True
    optimizer.step()
    return grad_norm, False


# ---------------------------------------------------------------- report
def trainable_table(adapter, cfg: OptimConfig | None = None) -> str:
    """One row per module group (parameters, trainable, lr) and a total row; lr needs `cfg`."""
    total = {g: 0 for g in GROUP_NAMES}
    train = {g: 0 for g in GROUP_NAMES}
    for name, param in adapter.model.named_parameters():
        for group in {adapter.module_group_of(name), adapter.training_group_of(name)}:  # a sub-group counts in both
            total[group] += param.numel()
            if param.requires_grad:
                train[group] += param.numel()

    def lr(group: str) -> str:
        if cfg is None or not train[group]:
            return "-"
        return f"{cfg.lr_for(group):.2e}"

    rows = [("group", "params", "trainable", "%", "lr")]
    for g in MODULE_GROUPS:
        rows.append((g, f"{total[g]:,}", f"{train[g]:,}", _pct(train[g], total[g]), lr(g)))
        for sub in (s for s, parent in SUB_GROUPS.items() if parent == g and total[s]):  # only where the model has it
            rows.append((f"  {sub}", f"{total[sub]:,}", f"{train[sub]:,}", _pct(train[sub], total[sub]), lr(sub)))
    all_total, all_train = (sum(d[g] for g in MODULE_GROUPS) for d in (total, train))
    rows.append(("total", f"{all_total:,}", f"{all_train:,}", _pct(all_train, all_total), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if k == 0 or k == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}" if whole else "-"
