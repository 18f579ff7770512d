"""Sampled evaluation, as TRL evaluates a GRPO run: each held-out prompt gets `eval.sampled_generations` completions drawn
as in training, the run's rewards score them, and the GRPO loss of that batch is taken without an update (on-policy:
ratio 1, so the loss is minus the token-weighted advantage, plus beta x KL against the reference). It reports TRL's
eval keys: loss, reward, reward_std, rewards/<f>/mean and /std. The greedy held-out evaluation (accuracy) is the
other half of `evaluate()` (grpo/parts/evaluation.py)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from vlm_grpo.grpo.algorithm.losses import LossInputs, PolicyObjective
from vlm_grpo.grpo.rewards.weighted import nan_mean, nan_std


@contextlib.contextmanager
def _generations(cfg, g: int):
    """The sampler and scoring read data.num_generations: evaluation draws its own count for the call's length."""
    kept = cfg.data.num_generations
    cfg.data.num_generations = g
    try:
        yield
    finally:
        cfg.data.num_generations = kept


class SampledEvaluation:
    def __init__(self, ctx, sampler, scoring, scorer, objective: PolicyObjective):
        self.ctx, self.cfg, self.sampler, self.scoring, self.scorer = ctx, ctx.cfg, sampler, scoring, scorer
        self.objective = objective  # the run's loss without the entropy control (no update follows)

    def run(self, source, step: int) -> dict[str, float]:
        """Metrics (unprefixed) over every sample of `source`, in batches of data.batch_size prompts."""
        cfg = self.cfg
        g = cfg.eval.sampled_generations or cfg.data.num_generations
        size = len(source)  # the held-out split as built (eval.size samples of the recipe's, or the rows given)
        if size == 0:
            return {}
        losses, tokens, rewards, components = [], [], [], {}
        with _generations(cfg, g), torch.no_grad():
            for start in range(0, size, cfg.data.batch_size):
                rows = list(range(start, min(start + cfg.data.batch_size, size)))
                samples = [source[i] for i in rows]
                sampled = self.sampler.sample(samples, rows, step)
                traj = self.scoring.score(samples, rows, sampled, step).trajectory
                traj.ref_logps = self.scorer.reference_logps(traj)
                scores = self.scorer.scores(traj, list(range(len(traj))), self.scorer.policy.model, with_entropy=True)
                loss, _ = self.objective(LossInputs(scores.logps, traj.advantages, traj.loss_mask,
                                                    ref_logps=traj.ref_logps, entropy=scores.entropy))
                weight = float(traj.loss_mask.sum())
                losses.append(float(loss) * weight)
                tokens.append(weight)
                rewards.append(traj.rewards)
                for name, values in traj.reward_components.items():
                    components.setdefault(name, []).append(values)
        total = torch.cat(rewards)
        out: dict[str, Any] = {"loss": sum(losses) / max(sum(tokens), 1.0), "reward": nan_mean(total),
                               "reward_std": nan_std(total)}
        for name, parts in components.items():
            values = torch.cat(parts)
            out[f"rewards/{name}/mean"], out[f"rewards/{name}/std"] = nan_mean(values), nan_std(values)
        return out
