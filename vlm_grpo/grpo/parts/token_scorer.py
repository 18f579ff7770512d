"""The log-probs (and entropies) of a trajectory's completion tokens under the policy, its old weights or the
reference, with the image features the step may share: the rollout's when nothing that produces them trains, or
the policy's own taken with gradient before the rollout (encode-once)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlm_grpo.adapters.sharing import image_features
from vlm_grpo.grpo.algorithm.trajectory import Trajectory
from vlm_grpo.grpo.logprobs.completions import ScoreOptions, group_scores
from vlm_grpo.grpo.training import gradient_checkpointing as checkpointing


@dataclass
class TokenScores:
    logps: torch.Tensor  # [rows, T]
    entropy: torch.Tensor | None  # [rows, T] when asked for
    aux_loss: torch.Tensor | None  # the MoE routers' load-balancing loss of these rows, when asked for and added


class TokenScorer:
    def __init__(self, ctx, policy, reference, encoder_frozen: bool, entropy_trains: bool, router_aux_coef: float):
        """`reference`: the Reference part (which model, if any, gives the KL term's log-probs); `encoder_frozen`: nothing that
        produces image features trains; `entropy_trains`: the entropy bonus's gradient flows."""
        self.ctx, self.cfg, self.policy = ctx, ctx.cfg, policy
        self.adapter = policy.adapter
        self.reference = reference
        self.encoder_frozen = encoder_frozen
        self.entropy_trains = entropy_trains
        self.router_aux_coef = router_aux_coef

    # ---------------------------------------------------------------- which image features a step shares
    def reuses_features(self) -> bool:
        perf = self.cfg.perf
        return (perf.share_image_features and perf.reuse_frozen_features and self.encoder_frozen
                and self.adapter.shares_features)  # the adapter proved the shared-features path for this model

    def encodes_once(self) -> bool:
        """Whether the policy's features, with gradient, can be computed before the rollout and serve both it and
        the update: the encoder trains (else the rollout's no-grad features serve), the policy runs one forward
        at the rollout's weights (one update of one micro-batch per rollout: not several iterations, nor several
        steps per generation), nothing drops the graph in between (gradient checkpointing, resharding) and the
        rollout is this process's own, of one batch (not an asynchronous worker's, nor joined by dynamic sampling)."""
        cfg, perf = self.cfg, self.cfg.perf
        return (perf.encode_once and perf.shared_prefix and perf.share_image_features and self.adapter.shares_features
                and not self.encoder_frozen
                and cfg.num_iterations == 1 and cfg.gradient_accumulation_steps == 1 and cfg.steps_per_generation == 1
                and not perf.gradient_checkpointing and not self.policy.sharded
                and not cfg.rollout.asynchronous and not cfg.data.dynamic_sampling)  # sampled elsewhere, or joined

    def _step_features(self, traj: Trajectory):
        """The step's image features when they may be reused (frozen encoder): the rollout's, or encoded once."""
        if not self.reuses_features():
            return None
        if traj.features is None:
            with torch.no_grad():
                traj.features = self.policy.forward(
                    lambda m: image_features(self.adapter, traj.prompts, model=m)).detach()
        return traj.features

    # ---------------------------------------------------------------- scores
    def scores(self, traj: Trajectory, rows: list[int], model, *, with_entropy: bool = False, features=None,
               router_aux: bool = False) -> TokenScores:
        """`features`: the prompts' image features to use (the policy's, taken with gradient before the rollout);
        None: the step's reusable ones, or else encoded in the forward."""
        perf = self.cfg.perf
        turns = None if traj.completion_images is None else traj.completion_images.select(rows)
        turn_features = None  # the tool images' features; None: encoded in the forward
        if turns is not None and features is not None:  # the policy's, with gradient, as the prompts' are
            turn_features = turns.policy_features
        elif turns is not None and self.reuses_features():  # the rollout's (a frozen encoder)
            turn_features = turns.features
        options = self.options(
            features=self._step_features(traj) if features is None else features,
            turns=turns, turn_features=turn_features,
            context=self.ctx.accelerator.autocast if model is self.policy.model else None,
            with_entropy=with_entropy,
            entropy_grad=with_entropy and self.entropy_trains,  # the bonus trains on the entropy
            router_aux=router_aux and self.router_aux_coef > 0,
        )

        def run(inner):  # returns tensors: a sharded root registers its backward hooks on them
            with checkpointing.active(inner, perf.gradient_checkpointing):
                out = group_scores(self.adapter, traj.prompts, traj.prompt_index(rows), traj.completion_ids[rows],
                                   traj.completion_mask[rows], inner, options)
            return out.logps, out.entropy, out.aux_loss

        return TokenScores(*self.policy.forward(run, model))

    def options(self, **per_call) -> ScoreOptions:
        """How the run's log-prob forwards compute (the rollout worker's included), with `per_call`'s fields."""
        perf = self.cfg.perf
        return ScoreOptions(share_features=perf.share_image_features,
                            share_prompt=perf.share_prompt and not perf.gradient_checkpointing,
                            padding_free=perf.padding_free, temperature=self.cfg.generation.temperature,
                            chunk_bytes=perf.logprob_chunk_mb * 2**20, **per_call)

    def policy_logps(self, traj: Trajectory, rows: list[int] | None = None, features=None) -> torch.Tensor:
        """The policy's log-probs of `rows` (default: all), without gradient; `features` as in `scores`."""
        rows = list(range(len(traj))) if rows is None else rows
        with torch.no_grad():
            return self.scores(traj, rows, self.policy.model, features=features).logps

    def sampling_policy_logps(self, traj: Trajectory) -> torch.Tensor:
        """The policy's log-probs at the weights that sampled `traj` (old log-probs; an engine's ratio), taken
        before any update: the image features already computed at those weights serve (the policy's own from
        before the rollout, detached, or the rollout's) instead of encoding the images again."""
        return self.policy_logps(traj, features=traj.features if traj.policy_features is None
                                 else traj.policy_features.detach())

    def reference_logps(self, traj: Trajectory) -> torch.Tensor | None:
        """The reference's log-probs (None: no KL term), as the Reference part decides."""
        if not self.reference.needed:
            return None
        rows = list(range(len(traj)))
        with torch.no_grad(), self.reference.weights(self.policy.model) as model:
            return self.scores(traj, rows, model).logps
