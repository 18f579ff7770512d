"""Freeze policies, per-module learning rates, the optimizer and its schedule.

Everything here derives from one declaration: the adapter's module groups (`vision`, `projector`,
`language`, `head`; see `VLMAdapter.module_patterns`). So a freeze policy or a learning-rate split
written once works on every family, and keeps working after LoRA wrapping (a LoRA matrix belongs to
the group of the layer it adapts).

How `apply_freeze` decides whether a parameter trains, in order:
1. the baseline: every parameter trains; on a LoRA-wrapped model only the LoRA matrices do;
2. the groups named in `freeze` (and in the preset's freeze list) are frozen;
3. a preset with an allow-list (`seed_hybrid`) freezes whatever it does not name;
4. `trainable_patterns` (regexes searched in the unwrapped parameter name) unfreeze again.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

import torch
from torch.distributed.tensor import DTensor

from vlm_grpo.adapters.module_groups import MODULE_GROUPS, strip_wrapper_prefix
from vlm_grpo.grpo.fsdp import full_tensor
from vlm_grpo.grpo.settings import SettingError, check_fields, setting

_LORA_PARAM = re.compile(r"\.lora_[A-Za-z_]+\.")
_PEFT_COPY = re.compile(r"\.(?:modules_to_save\.[^.]+|original_module)\.")  # peft's modules_to_save wrapper
# decoder-block containers across families: `layers.N.` (most decoder LMs), `layer.N.`, `h.N.` (GPT-2), `blocks.N.`
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)\.")


def is_lora_param(name: str) -> bool:
    return bool(_LORA_PARAM.search(name))


def _is_lora_wrapped(model: torch.nn.Module) -> bool:
    return any(is_lora_param(n) for n, _ in model.named_parameters())


# ---------------------------------------------------------------- presets
@dataclass(frozen=True)
class FreezePreset:
    """A named freeze policy: groups to freeze and/or an allow-list of parameters that stay trainable."""

    description: str
    freeze: tuple[str, ...] = ()
    # adapter -> predicate over unwrapped parameter names; None: no allow-list
    allow: Callable[..., Callable[[str], bool]] | None = None


def seed_hybrid_allow(adapter, lm_layers: int = 5) -> Callable[[str], bool]:
    """The freeze policy of the "LLM learns to see" recipe (a ViT + 0.5B-LM hybrid, SFT then GRPO): train only
    the projector's output layer (the layout's `projector_output`, else its last Linear), the input embedding
    and the first `lm_layers` decoder layers of the language model. Found from the module layout, not from any
    family's names.

    With tied input/output embeddings the head shares the embedding tensor and so trains too (as in that
    recipe's 0.5B LM); an untied head stays frozen.
    """
    model = adapter.model
    is_output = _projector_output(adapter)
    prefixes = []
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embedding = base.get_input_embeddings()
    emb_names = [_module_name(n) for n, m in model.named_modules() if m is embedding]
    if emb_names:
        prefixes.append(emb_names[0])
    language = [strip_wrapper_prefix(n) for n, _ in model.named_parameters() if adapter.module_group_of(n) == "language"]
    if not any(_LAYER_INDEX.search(n) for n in language):
        raise ValueError(f"freeze preset 'seed_hybrid': no numbered decoder layers found in the language model of {adapter.family}")

    def allowed(name: str) -> bool:
        name = strip_wrapper_prefix(name)
        if is_output(name) or any(name.startswith(p + ".") for p in prefixes):
            return True
        if adapter.module_group_of(name) != "language":
            return False
        m = _LAYER_INDEX.search(name)
        return m is not None and int(m.group(1)) < lm_layers

    return allowed


def _projector_output(adapter) -> Callable[[str], bool]:
    """A predicate over unwrapped parameter names: does it belong to the projector's output layer?"""
    declared = adapter.module_layout.projector_output
    names = [strip_wrapper_prefix(n) for n, _ in adapter.model.named_parameters()]
    if declared:
        if not any(re.match(p, n) for p in declared for n in names):
            raise ValueError(f"freeze preset 'seed_hybrid': {adapter.family}'s projector_output {declared} matches nothing")
        return lambda name: any(re.match(p, name) for p in declared)
    linears = [
        _module_name(n)
        for n, m in adapter.model.named_modules()
        if isinstance(m, torch.nn.Linear) and n and ".lora_" not in n and adapter.module_group_of(n + ".weight") == "projector"
    ]
    if not linears:
        raise ValueError(f"freeze preset 'seed_hybrid': the projector of {adapter.family} has no Linear layer "
                         "and its module layout declares no projector_output")
    last = linears[-1]  # registration order: the output layer is declared last
    return lambda name: name.startswith(last + ".")


def _module_name(name: str) -> str:
    """Unwrapped module name; a LoRA layer's inner `base_layer` stands for the layer itself."""
    name = strip_wrapper_prefix(name)
    return name[: -len(".base_layer")] if name.endswith(".base_layer") else name


FREEZE_PRESETS: dict[str, FreezePreset] = {
    "seed_hybrid": FreezePreset(
        "train the projector's last Linear, the input embedding and LM layers 0-4; freeze the rest",
        allow=seed_hybrid_allow,
    ),
    "vision_frozen": FreezePreset("freeze the vision tower", freeze=("vision",)),
    "lm_only": FreezePreset("freeze the vision tower and the projector", freeze=("vision", "projector")),
}


# ---------------------------------------------------------------- config
@dataclass
class OptimConfig:
    learning_rate: float = setting(1e-5, help="learning rate of every module group without its own", at_least=0.0)
    vision_lr: float | None = setting(None, help="vision tower learning rate (None: learning_rate)", at_least=0.0)
    projector_lr: float | None = setting(None, help="projector learning rate (None: learning_rate)", at_least=0.0)
    language_lr: float | None = setting(None, help="language model learning rate (None: learning_rate)", at_least=0.0)
    head_lr: float | None = setting(None, help="LM head learning rate (None: learning_rate)", at_least=0.0)
    weight_decay: float = setting(0.0, help="AdamW weight decay", at_least=0.0)
    adam_betas: tuple[float, float] = setting((0.9, 0.999), help="AdamW betas")
    adam_eps: float = setting(1e-8, help="AdamW epsilon", above=0.0)
    max_grad_norm: float = setting(1.0, help="clip the gradient norm to this (<= 0: measure only)")
    freeze: list[str] = setting(factory=list, help="module groups to freeze: vision, projector, language, head")
    trainable_patterns: list[str] = setting(factory=list, help="regexes of parameter names trained again after freeze")
    freeze_preset: str | None = setting(None, help="a named freeze policy: " + ", ".join(sorted(FREEZE_PRESETS)))
    lr_scheduler: str = setting("constant_with_warmup", help="any schedule transformers.get_scheduler knows")
    warmup_steps: int = setting(0, help="warm-up steps (wins over warmup_ratio when > 0)", at_least=0)
    warmup_ratio: float = setting(0.0, help="warm-up as a share of the run's scheduler steps", at_least=0.0, at_most=1.0)

    def __post_init__(self) -> None:
        self.freeze = list(self.freeze)
        self.trainable_patterns = list(self.trainable_patterns)
        self.adam_betas = tuple(self.adam_betas)
        check_fields(self)
        unknown = [g for g in self.freeze if g not in MODULE_GROUPS]
        if unknown:
            raise SettingError(
                "freeze", f"unknown module group(s) {unknown} in freeze; valid module groups: {', '.join(MODULE_GROUPS)}"
            )
        if self.freeze_preset is not None and self.freeze_preset not in FREEZE_PRESETS:
            raise SettingError("freeze_preset", f"unknown freeze preset {self.freeze_preset!r}; known presets: "
                               f"{', '.join(sorted(FREEZE_PRESETS))}")
        for pattern in self.trainable_patterns:
            try:
                re.compile(pattern)
            except re.error as err:
                raise SettingError("trainable_patterns", f"{pattern!r} is not a valid regex ({err})") from None
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise SettingError("adam_betas", f"{self.adam_betas!r} must be two numbers in [0, 1)")
        from transformers import SchedulerType

        try:
            SchedulerType(self.lr_scheduler)
        except ValueError:
            valid = ", ".join(s.value for s in SchedulerType)
            raise SettingError("lr_scheduler", f"unknown lr_scheduler {self.lr_scheduler!r}; transformers accepts: {valid}") from None

    def lr_for(self, group: str) -> float:
        if group not in MODULE_GROUPS:
            raise ValueError(f"unknown module group {group!r}; valid module groups: {', '.join(MODULE_GROUPS)}")
        lr = getattr(self, f"{group}_lr")
        return self.learning_rate if lr is None else lr

    def frozen_groups(self) -> set[str]:
        preset = FREEZE_PRESETS[self.freeze_preset] if self.freeze_preset else None
        return set(self.freeze) | set(preset.freeze if preset else ())


# ---------------------------------------------------------------- freezing
def apply_freeze(adapter, cfg: OptimConfig) -> None:
    """Set `requires_grad` on every parameter of `adapter.model` from `cfg` (see the module docstring)."""
    model = adapter.model
    wrapped = _is_lora_wrapped(model)
    frozen = cfg.frozen_groups()
    preset = FREEZE_PRESETS[cfg.freeze_preset] if cfg.freeze_preset else None
    allow = preset.allow(adapter) if preset and preset.allow else None
    patterns = [re.compile(p) for p in cfg.trainable_patterns]
    hits = [0] * len(patterns)
    for name, param in model.named_parameters():
        short = strip_wrapper_prefix(name)
        plain = _PEFT_COPY.sub(".", short)  # a modules_to_save copy or original, named as the module it stands for
        trainable = is_lora_param(short) if wrapped else True
        trainable = trainable and adapter.module_group_of(name) not in frozen
        trainable = trainable and (allow is None or allow(short))
        for i, pattern in enumerate(patterns):
            if pattern.search(plain):
                hits[i] += 1
                if wrapped and ".modules_to_save." not in short:
                    if ".original_module." in short:
                        continue  # the reference's copy: never trains
                    raise ValueError(f"{short}: under LoRA a module trained whole must be a trainable copy "
                                     "(apply_lora(..., train_fully=trainable_patterns)), or the reference would "
                                     "move with it and the adapter checkpoint would not hold it")
                trainable = True
        if param.is_floating_point():  # quantized storage (4-bit) can never train
            param.requires_grad_(trainable)
        elif trainable and not wrapped:
            raise ValueError(f"{short} is stored as {param.dtype} and cannot train; freeze it or use LoRA")
    missing = [p.pattern for p, n in zip(patterns, hits) if n == 0]
    if missing:
        raise ValueError(f"trainable_patterns {missing} match no parameter of {adapter.family}")


# ---------------------------------------------------------------- optimizer
def param_groups(adapter, cfg: OptimConfig) -> list[dict]:
    """One optimizer group per module group with trainable parameters (current `requires_grad`)."""
    by_group: dict[str, list[torch.nn.Parameter]] = {g: [] for g in MODULE_GROUPS}
    for name, param in adapter.model.named_parameters():
        if param.requires_grad:
            by_group[adapter.module_group_of(name)].append(param)
    groups = [
        {"name": g, "params": params, "lr": cfg.lr_for(g), "weight_decay": cfg.weight_decay}
        for g, params in by_group.items()
        if params
    ]
    if not groups:
        raise ValueError(f"no trainable parameter left in {adapter.family}: the freeze policy froze everything")
    return groups


def build_optimizer(adapter, cfg: OptimConfig) -> torch.optim.AdamW:
    """Apply the freeze policy, then AdamW over the per-module-group parameter groups."""
    apply_freeze(adapter, cfg)
    return torch.optim.AdamW(
        param_groups(adapter, cfg), lr=cfg.learning_rate, betas=cfg.adam_betas, eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )


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
        cfg.lr_scheduler, optimizer, num_warmup_steps=warmup_steps_for(cfg, total_steps), num_training_steps=total_steps
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
    total = {g: 0 for g in MODULE_GROUPS}
    train = {g: 0 for g in MODULE_GROUPS}
    for name, param in adapter.model.named_parameters():
        group = adapter.module_group_of(name)
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
    all_total, all_train = sum(total.values()), sum(train.values())
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
