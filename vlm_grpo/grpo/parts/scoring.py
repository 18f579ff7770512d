"""GRPO's scoring: a rollout's completions through the run's named rewards, the loss mask, and the registered
advantage estimator, as one Trajectory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES, reward_scores
from vlm_grpo.grpo.algorithm.trajectory import Trajectory, model_tokens
from vlm_grpo.grpo.rewards.inputs import RewardInputs, trainer_state
from vlm_grpo.grpo.rewards.weighted import score


@dataclass
class Scored:
    trajectory: Trajectory
    reward_errors: dict[str, int]  # failed calls per reward (data.on_reward_error zero)
    advantage_metrics: dict[str, Any]  # the estimator's own metrics
    logged: dict[str, list[float]] = field(default_factory=dict)  # what rewards logged through log_metric


@dataclass
class Rewarded:
    """A rollout's rewards, before the advantages: what dynamic sampling reads to keep or drop a prompt's group."""

    total: Any  # [N] the weighted total (NaN: no reward applies)
    components: dict[str, Any]  # name -> [N]
    errors: dict[str, int]
    extra: dict[str, list]  # columns rewards logged (log_extra), one value per row
    logged: dict[str, list[float]]


class Scoring:
    def __init__(self, ctx, rewards: list, scorer):
        self.ctx, self.cfg, self.rewards = ctx, ctx.cfg, rewards
        self.scorer = scorer  # says whether the step encodes the images once

    def score(self, samples: list, rows: list[int], sampled, step: int) -> Scored:
        return self.trajectory(rows, sampled, self.rewards_of(samples, rows, sampled, step))

    def rewards_of(self, samples: list, rows: list[int], sampled, step: int) -> Rewarded:
        cfg, g, ro = self.cfg, self.cfg.data.num_generations, sampled.rollout
        inputs = RewardInputs.from_samples(samples, g, ro.completions, ro.completion_ids, ro.completion_mask,
                                           trainer_state(step, cfg.max_steps))
        if ro.conversations is not None:  # rewards get the whole conversation, as TRL passes it
            inputs.with_tools(sampled.session, ro.conversations)
        inputs.rows = [rows[i // g] for i in range(len(inputs))]
        inputs.fields.update(ro.extra_fields)  # a rollout_func's own columns, as TRL hands them to the rewards
        reward_errors: dict[str, int] = {}
        total, components = score(self.rewards, inputs, on_error=cfg.data.on_reward_error, errors=reward_errors,
                                  timeout=cfg.data.reward_timeout or None)
        extra = {k: v for k, v in inputs.extra_columns.items() if len(v) == len(ro.completions)}
        return Rewarded(total, components, reward_errors, extra, inputs.logged_metrics)

    def trajectory(self, rows: list[int], sampled, rewarded: Rewarded) -> Scored:
        """The loss mask, the advantages and the Trajectory of a rollout and its rewards."""
        cfg, g, ro = self.cfg, self.cfg.data.num_generations, sampled.rollout
        total, components = rewarded.total, rewarded.components
        loss_mask = model_tokens(ro.completion_mask, ro.tool_mask)  # tool turns train on no token
        if cfg.loss.mask_truncated_completions:  # a completion cut at the length limit trains on no token
            loss_mask = loss_mask * (~ro.truncated).unsqueeze(1).to(loss_mask.dtype)
        scores = reward_scores(components, [r.weight for r in self.rewards], g, cfg.multi_objective_aggregation)
        advantages, metrics = ADVANTAGES[cfg.advantage]().estimate(scores, loss_mask, cfg)
        traj = Trajectory(
            prompts=ro.prompts, sample_indices=rows, prompt_texts=ro.prompt_texts, completions=ro.completions,
            completion_ids=ro.completion_ids, completion_mask=ro.completion_mask, loss_mask=loss_mask,
            rewards=total, reward_components=components, advantages=advantages.to(self.ctx.device),
            num_generations=g, features=ro.features, stats=ro.stats,
            extra=rewarded.extra,
            tool_mask=ro.tool_mask, completion_images=ro.completion_images, conversations=ro.conversations,
            tool_metrics=ro.tool_metrics,
        )
        traj.policy_features = sampled.policy_features
        if traj.completion_images is not None and self.scorer.encodes_once():
            traj.completion_images.policy_features = ro.turn_features  # with gradient, for the single update
        return Scored(traj, rewarded.errors, metrics, rewarded.logged)
