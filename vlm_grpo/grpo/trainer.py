"""The shared GRPO loop. It asks the adapter for everything model-specific and knows no family.

One step: pick B prompts -> encode once -> sample G completions each -> score (named rewards) ->
group advantages -> log-probs (old, reference) -> `num_iterations` clipped-ratio updates.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from typing import Any

import torch

from vlm_grpo.grpo.advantages import group_advantages
from vlm_grpo.grpo.base_trainer import BaseTrainer, load_policy  # noqa: F401  (load_policy: public here too)
from vlm_grpo.grpo.config import TrainConfig
from vlm_grpo.grpo.data_order import step_seed
from vlm_grpo.grpo.logprobs import completion_logits, token_logprobs
from vlm_grpo.grpo.lora import is_lora_wrapped, reference_disabled
from vlm_grpo.grpo.loss import grpo_loss
from vlm_grpo.grpo.optim import clip_gradients
from vlm_grpo.grpo.rewards import parse_reward_specs, score
from vlm_grpo.grpo.rollout import Rollout, rollout

log = logging.getLogger(__name__)


def entropy_of(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return (ent * mask).sum() / mask.sum().clamp(min=1)


class GRPOTrainer(BaseTrainer):
    """The run plumbing (run dir, policy, freeze/LoRA, optimizer, checkpoints, loop) is BaseTrainer's."""

    stage = "grpo"

    def __init__(self, cfg: TrainConfig, adapter=None, recipe=None):
        cfg.loss.max_completion_length = cfg.generation.max_new_tokens
        self.reference = None
        super().__init__(cfg, adapter=adapter, recipe=recipe)

    # ---------------------------------------------------------------- hooks
    def _prepare_task(self) -> None:
        cfg = self.cfg
        self.rewards = parse_reward_specs(cfg.data.rewards) if cfg.data.rewards else list(self.recipe.rewards)

    def _after_freeze(self) -> None:
        if self.cfg.loss.beta > 0 and not is_lora_wrapped(self.adapter):
            # A frozen in-memory copy: never reloaded from disk by name.
            self.reference = copy.deepcopy(self.adapter.model).eval().requires_grad_(False)

    def scheduler_steps(self) -> int:
        return self.cfg.max_steps * self.cfg.num_iterations

    def progress_postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward']:.3f}", "kl": f"{metrics.get('kl', 0.0):.2e}"}

    # ---------------------------------------------------------------- one step
    def _logprobs(self, ro: Rollout, rows: list[int], model, with_logits: bool = False):
        logits = completion_logits(self.adapter, ro.grouped.select(rows), ro.completion_ids[rows], ro.completion_mask[rows], model=model)
        logps = token_logprobs(logits, ro.completion_ids[rows])
        return (logps, logits) if with_logits else logps

    def _reference_logprobs(self, ro: Rollout, rows: list[int]) -> torch.Tensor | None:
        if self.cfg.loss.beta <= 0:
            return None
        with torch.no_grad():
            if self.reference is not None:
                return self._logprobs(ro, rows, self.reference)
            with reference_disabled(self.adapter):
                return self._logprobs(ro, rows, self.adapter.model)

    def _chunks(self, n_rows: int) -> list[list[int]]:
        g, steps = self.cfg.data.num_generations, self.cfg.gradient_accumulation_steps
        groups = n_rows // g
        if groups % steps:
            raise ValueError(f"gradient_accumulation_steps={steps} must divide the {groups} prompt groups of a step")
        per = groups // steps
        return [list(range(c * per * g, (c + 1) * per * g)) for c in range(steps)]

    def train_step(self, step: int) -> dict[str, Any]:
        cfg, acc = self.cfg, self.accelerator
        started = time.perf_counter()
        torch.manual_seed(step_seed(cfg.seed, step, acc.process_index))
        samples, indices = self._samples(step)
        ro = rollout(self.adapter, samples, cfg.generation, cfg.data.num_generations, acc.device)
        reward_errors: dict[str, int] = {}
        total, components = score(self.rewards, ro.completions, ro.fields, cfg.data.on_reward_error, reward_errors)
        advantages, adv_metrics = group_advantages(total, cfg.data.num_generations, cfg.scale_rewards)
        advantages = advantages.to(acc.device)
        mask = ro.completion_mask
        rows = list(range(len(total)))
        chunks = self._chunks(len(rows))
        ref = self._reference_logprobs(ro, rows)
        old = None
        if cfg.num_iterations > 1:
            with torch.no_grad():
                old = self._logprobs(ro, rows, self.model)
        # dapo divides by the tokens of the whole step; DDP averages gradients, so scale by the process count.
        tokens = acc.reduce(mask.sum().float(), reduction="sum") / acc.num_processes
        sums: dict[str, float] = {}
        skipped = 0
        for _ in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for k, chunk in enumerate(chunks):
                sync = contextlib.nullcontext() if k == len(chunks) - 1 else acc.no_sync(self.model)
                with sync:
                    logps, logits = self._logprobs(ro, chunk, self.model, with_logits=True)
                    loss, loss_metrics = grpo_loss(
                        logps,
                        None if old is None else old[chunk],
                        None if ref is None else ref[chunk],
                        advantages[chunk],
                        mask[chunk],
                        cfg.loss,
                        normalizer=tokens,
                    )
                    # grpo/dr_grpo normalise per chunk of rows; dapo already divides by the whole step's tokens.
                    weight = 1.0 if cfg.loss.loss_type == "dapo" else len(chunk) / len(rows)
                    acc.backward(loss * weight)
                with torch.no_grad():
                    loss_metrics = {**loss_metrics, "loss": loss.item(), "entropy": entropy_of(logits.detach(), mask[chunk]).item()}
                for key, value in loss_metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(value) * len(chunk) / len(rows) / cfg.num_iterations
            grad_norm = clip_gradients(self.optimizer, cfg.optim)
            if torch.isfinite(torch.as_tensor(grad_norm)).item():
                self.optimizer.step()
            else:
                skipped += 1
                log.warning("step %d: non-finite gradient norm, update skipped", step)
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        metrics = {
            **sums,
            "reward": total.mean().item(),
            "reward_std": total.std().item() if len(total) > 1 else 0.0,
            **{f"rewards/{name}": v.mean().item() for name, v in components.items()},
            **{k: float(v) for k, v in adv_metrics.items() if k not in ("reward_mean", "reward_std")},
            "completion_length": mask.sum(1).float().mean().item(),
            "grad_norm": float(grad_norm),
            "skipped_updates": skipped,
            **{f"reward_errors/{r.name}": reward_errors.get(r.name, 0) for r in self.rewards if cfg.data.on_reward_error == "zero"},
            **{f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups},
        }
        metrics = self._mean_over_processes(metrics)
        metrics.update(step=step + 1, step_time=time.perf_counter() - started)
        self._log_completions(step + 1, ro, total, components, advantages, indices)
        return metrics

    def _log_completions(self, step, ro: Rollout, total, components, advantages, indices) -> None:
        if not self.cfg.logging.log_completions:
            return
        g = self.cfg.data.num_generations
        rows = []
        for i, text in enumerate(ro.completions):
            rows.append(
                {
                    "step": step,
                    "process": self.accelerator.process_index,
                    "sample_index": indices[i // g],
                    "prompt": ro.prompt_texts[i // g],
                    "completion": text,
                    "reward": total[i].item(),
                    "rewards": {name: v[i].item() for name, v in components.items()},
                    "advantage": advantages[i].item(),
                }
            )
        gathered = self._gather_rows(rows)
        self.log.completions(gathered)

    def _gather_rows(self, rows: list[dict]) -> list[dict]:
        if self.accelerator.num_processes == 1:
            return rows
        from accelerate.utils import gather_object

        return gather_object(rows)


def train(cfg: TrainConfig) -> list[dict[str, Any]]:
    return GRPOTrainer(cfg).train()


