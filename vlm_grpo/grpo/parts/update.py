"""GRPO's update: `num_iterations` optimizer updates on a scored trajectory, each over whole-group micro-batches,
with the registered policy loss; the entropy control and the reference's sync follow each update. Its own state
(updates so far, the entropy control, a synced reference's weights) travels in the run's checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from vlm_grpo.grpo.algorithm.losses import LossInputs, PolicyObjective
from vlm_grpo.grpo.algorithm.sampling_correction import CorrectionTally
from vlm_grpo.grpo.algorithm.trajectory import Trajectory

log = logging.getLogger(__name__)


def _rows(x: torch.Tensor | None, rows: list[int]) -> torch.Tensor | None:
    return None if x is None else x[rows]


class PolicyUpdate:
    def __init__(self, ctx, policy, scorer, objective: PolicyObjective, reference):
        self.ctx, self.cfg, self.policy, self.scorer = ctx, ctx.cfg, policy, scorer
        self.objective = objective  # the run's loss, with its entropy control and its processes' collective
        self.entropy_control = objective.entropy_control
        self.reference = reference  # the Reference part: loss.sync_ref_model moves it after updates
        self.updates = 0  # optimizer updates so far (the reference sync counts them)

    def run(self, traj: Trajectory, step: int, rows: list[int] | None = None) -> dict[str, float]:
        """The metrics averaged over updates and micro-batches. `rows`: the part of the trajectory this step trains
        on (steps_per_generation > 1), split into equal micro-batches; None: all of it, whole prompt groups each."""
        cfg, acc, policy = self.cfg, self.ctx.accelerator, self.policy
        if rows is None:
            chunks = traj.micro_batches(cfg.gradient_accumulation_steps)
            mask = traj.loss_mask
        else:
            per = len(rows) // cfg.gradient_accumulation_steps
            chunks = [rows[c * per:(c + 1) * per] for c in range(cfg.gradient_accumulation_steps)]
            mask = traj.loss_mask[rows]
        trained = sum(len(c) for c in chunks)
        # the step's training tokens per process (step_tokens losses; DDP averages gradients over processes)
        tokens = acc.reduce(mask.sum().float(), reduction="sum") / acc.num_processes
        coef = self.scorer.router_aux_coef
        # a batch sampled elsewhere, trained by one update: the engine correction from this update's own log-probs
        tally = CorrectionTally(cfg.rollout) if traj.sampling_logps is not None and traj.old_logps is None \
            and traj.sampling_ratio is None and cfg.num_iterations == 1 else None
        sums: dict[str, float] = {}
        skipped = undone = 0
        for _ in range(cfg.num_iterations):
            policy.zero_grad()
            for k, part in enumerate(chunks):
                with policy.accumulating(last=k == len(chunks) - 1):
                    scores = self.scorer.scores(traj, part, policy.model, with_entropy=True,
                                                features=traj.policy_features, router_aux=True)
                    ratio = _rows(traj.sampling_ratio, part) if tally is None else \
                        tally.ratio(scores.logps, traj.sampling_logps[part], traj.loss_mask[part])
                    loss, metrics = self.objective(LossInputs(
                        scores.logps, traj.advantages[part], traj.loss_mask[part], old_logps=_rows(traj.old_logps, part),
                        ref_logps=_rows(traj.ref_logps, part), entropy=scores.entropy,
                        sampling_logps=_rows(traj.sampling_logps, part), sampling_ratio=ratio,
                        normalizer=tokens, share=len(part) / trained))
                    if scores.aux_loss is not None:  # MoE (TRL's rule): + coef x routers' balancing loss, per micro-batch
                        loss = loss + coef * scores.aux_loss / len(chunks)
                        metrics["aux_loss"] = scores.aux_loss.item()
                    acc.backward(loss)
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(value) * len(part) / trained / cfg.num_iterations
            grad_norm, was_skipped = policy.update(cfg.optim, step + 1)
            if was_skipped:
                skipped += 1
                undone += bool(policy.undone)
                log.warning("step %d: %s", step + 1, policy.skip_reason())
            policy.scheduler.step()
            policy.zero_grad()
            self.entropy_control.end_update(self.objective.collective.reduce_sum)
            if self.entropy_control.enabled:  # TRL logs the coefficient as it stands after the update
                sums["entropy_coef"] = sums.get("entropy_coef", 0.0) + self.entropy_control.coef / cfg.num_iterations
            self.updates += 1
            self.reference.after_update(self.updates, policy.adapter.model)
        engine = {} if tally is None else self.ctx.extremes_over_processes(tally.metrics())
        return {**sums, **engine, "grad_norm": float(grad_norm), "skipped_updates": skipped, "undone_updates": undone}

    # ---------------------------------------------------------------- in the run's checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer_updates": self.updates, "entropy_control": self.entropy_control.state_dict()}

    def load_state_dict(self, state: dict[str, Any], checkpoint: Path) -> None:
        self.updates = int(state.get("optimizer_updates", 0))
        if "entropy_control" in state:
            self.entropy_control.load_state_dict(state["entropy_control"])
        self.reference.load(checkpoint)

    def save_files(self, directory: Path) -> None:
        self.reference.save_files(directory)
