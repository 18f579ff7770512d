"""GRPO's stage: its step parts, built once in the stage's one pass (loop/stage.py), and its step read top-down in
`GRPOStage.train_step`: B prompts -> G sampled completions each (sampler) -> named rewards, advantages, the
Trajectory (scoring) -> old / reference log-probs (scorer, asking the Reference part) -> `num_iterations` updates of
the registered loss (policy_update) -> metrics and completions (step_log). It knows no family and names no loss or
estimator: those are the adapter's and the registries' (grpo/algorithm/)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vlm_grpo.grpo.algorithm.losses import Collective, EntropyControl, PolicyObjective
from vlm_grpo.grpo.algorithm.sampling_correction import weigh_by_engine
from vlm_grpo.grpo.guards.hacking_watch import HackingWatch
from vlm_grpo.grpo.loop.stage import RunInputs, Stage
from vlm_grpo.grpo.parts.checkpointing import KeptUnder
from vlm_grpo.grpo.parts.dynamic_sampling import DynamicSampling
from vlm_grpo.grpo.parts.generation_state import GenerationInProgress
from vlm_grpo.grpo.parts.rollout_source import AsyncDraws, SyncDraws
from vlm_grpo.grpo.parts.reference import Reference
from vlm_grpo.grpo.parts.sampled_evaluation import SampledEvaluation
from vlm_grpo.grpo.parts.sampler import Sampler
from vlm_grpo.grpo.parts.scoring import Scoring
from vlm_grpo.grpo.parts.step_log import StepLog
from vlm_grpo.grpo.parts.token_scorer import TokenScorer
from vlm_grpo.grpo.parts.update import PolicyUpdate
from vlm_grpo.grpo.setting_fields import SettingError
from vlm_grpo.grpo.tools.chat_format import ChatFormat
from vlm_grpo.grpo.tools.toolset import final_message_rewards, run_toolset
from vlm_grpo.grpo.training.vision_counter import VisionCounter


@dataclass
class Generation:
    """One rollout batch and what its steps share: the prompts, the scored trajectory, the engine's correction
    metrics, how it was drawn (asynchronous staleness, dynamic sampling), and the shuffled row order its steps split
    (steps_per_generation parts)."""

    index: int
    batch: Any
    scored: Any
    engine_metrics: dict[str, float]
    draw_metrics: dict[str, float]
    order: list[int]
    parts: int
    report: dict[str, float] = field(default_factory=dict)  # its reward and completion metrics, taken once
    restored: bool = False  # read back from a checkpoint saved inside it: its first step's logs were written then

    def part(self, k: int) -> list[int]:
        size = len(self.order) // self.parts
        return self.order[k * size:(k + 1) * size]


class GRPOStage(Stage):
    stage = "grpo"
    evaluates_around = True

    # ---------------------------------------------------------------- the parts of GRPO's step, built once
    def _build(self, cfg, inputs) -> None:
        self.entropy_control = EntropyControl(cfg.loss)
        self.timings: dict[str, float] = {}  # seconds of the last step's phases (kept out of the metrics)
        self._generation: Generation | None = None  # the rollout batch the current steps train on
        super()._build(cfg, inputs)

    def _assemble_before_policy(self, adapter) -> Reference:
        self.reference_part = Reference(self.cfg.loss, adapter)  # one place decides which model, if any, it is
        groups = adapter.module_groups()
        params = dict(adapter.model.named_parameters())
        # The features the rollout computed stay valid for every forward of the step only if nothing that
        # produces them trains (the projector included: features are taken after it).
        self.encoder_frozen = not any(params[n].requires_grad for g in ("vision", "projector") for n in groups[g])
        self.vision_counter = VisionCounter(adapter, [adapter.model, *self.reference_part.models()])
        # MoE: the routers' load-balancing loss joins the policy loss with this weight (0.0: not added)
        self.router_aux_coef = adapter.router_aux_loss_coef(self.cfg.loss.router_aux_loss_coef)
        return self.reference_part

    @property
    def reference(self):
        """The frozen reference copy (None: LoRA's base serves, or no KL term)."""
        return self.reference_part.model

    def _assemble_step(self, inputs: RunInputs) -> list:
        cfg, ctx, data, policy, t = self.cfg, self.ctx, self.data, self.policy, self.cfg.tools
        self.toolset = run_toolset(data.recipe, t.tools, t.environment, recipe_tools=t.recipe_tools,
                                   timeout=t.tool_timeout, tools=inputs.tools,
                                   environment_factory=inputs.environment_factory, isolation=t.isolation,
                                   on_error=t.on_tool_error)
        if self.toolset.enabled:  # a recipe written for one answer reads the final message of a multi-turn rollout
            data.rewards = final_message_rewards(data.recipe, data.rewards)
        data.rewards += self.toolset.rewards()  # an environment's get_reward (TRL: named after its class)
        chat_format = ChatFormat(self.adapter) if self.toolset.enabled else None
        self.scorer = TokenScorer(ctx, policy, self.reference_part, self.encoder_frozen,
                                  entropy_trains=self.entropy_control.enabled, router_aux_coef=self.router_aux_coef)
        self.watch = HackingWatch(ctx, data, policy, score=self.scorer.policy_logps)  # the reward audit, now
        self.sampler = Sampler(ctx, policy, self.scorer, self.toolset, chat_format, inputs.rollout_func, owner=self.owner)
        self.scoring = Scoring(ctx, data.rewards, self.scorer)
        self._check_rollout_plan(inputs)
        # where rollout batches come from: sampled now, or by a worker process K steps ahead (rollout_source.py)
        self.draws = AsyncDraws(ctx, data, self.sampler, policy, self.scorer.options()) if cfg.rollout.asynchronous \
            else SyncDraws(ctx, data, self.sampler)
        self.generation_state = GenerationInProgress(cfg, self.draws)  # a checkpoint inside a generation keeps it
        self.dynamic_sampling = None if not cfg.data.dynamic_sampling else DynamicSampling(
            ctx, self.scoring, self.adapter, self.sampler.prompt_cache,
            agree_across_processes=not cfg.rollout.asynchronous)
        # the loss, built once: the update's statistics cross processes and step the entropy control; the sampled
        # evaluation's are its own process's, and it leaves the entropy control alone (no update follows)
        collective = Collective(reduce_sum=lambda x: ctx.accelerator.reduce(x, reduction="sum"), gather=ctx.gather_tensor)
        # dr_grpo's normaliser is the run's completion limit (TRL: max_completion_length), derived here, not stored
        loss_cfg = replace(cfg.loss, max_completion_length=cfg.generation.max_new_tokens)
        objective = PolicyObjective(loss_cfg, entropy_control=self.entropy_control, collective=collective)
        self.policy_update = PolicyUpdate(ctx, policy, self.scorer, objective, self.reference_part)
        self.step_log = StepLog(ctx, data.rewards, policy, self.vision_counter, self.watch.flags)
        self.sampled_evaluation = SampledEvaluation(ctx, self.sampler, self.scoring, self.scorer,
                                                    PolicyObjective(loss_cfg))
        return [self.policy_update, KeptUnder("guards", self.watch), KeptUnder("step_log", self.step_log), self.draws,
                self.generation_state]

    def _check_rollout_plan(self, inputs: RunInputs) -> None:
        """What asynchronous rollouts and dynamic sampling cannot take, known once the run's tools are: refused."""
        cfg = self.cfg
        for name, on in (("rollout.max_staleness", cfg.rollout.asynchronous),
                         ("data.dynamic_sampling", cfg.data.dynamic_sampling)):
            if on and self.toolset.enabled:
                raise SettingError(name, "does not take tool rollouts (this run's recipe or settings give it tools; "
                                   "tools.recipe_tools false drops the recipe's)")
            if on and inputs.rollout_func is not None:
                raise SettingError(name, "does not take a rollout_func (its rollouts are the function's own)")
        if cfg.rollout.asynchronous and self.ctx.accelerator.num_processes > 1:
            raise SettingError("rollout.max_staleness", f"asynchronous rollouts run with one process here, and this "
                               f"run has {self.ctx.accelerator.num_processes}: launch one, or set it 0")

    def scheduler_steps(self) -> int:
        return self.cfg.max_steps * self.cfg.num_iterations

    def completions_per_prompt(self) -> int:
        return self.cfg.data.num_generations

    def sampled_metrics(self, rows, step: int) -> dict[str, float]:
        return self.sampled_evaluation.run(rows, step)  # sampled and scored as a training step's rollout is

    def progress_postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward']:.3f}", "kl": f"{metrics.get('kl', 0.0):.2e}"}

    def halted(self) -> str | None:
        return self.watch.halt

    def train(self, resume_from_checkpoint: bool | str | None = None):
        try:
            return super().train(resume_from_checkpoint)
        finally:
            self.draws.close()  # an asynchronous run's worker process

    # ---------------------------------------------------------------- the GRPO step, top-down
    def train_step(self, step: int) -> dict[str, Any]:
        """rollout -> rewards -> advantages -> old / reference log-probs -> `num_iterations` updates. With
        steps_per_generation k > 1 a rollout batch is sampled every k steps and each step trains on its part."""
        cfg = self.cfg
        started = time.perf_counter()
        k = cfg.steps_per_generation
        fresh = step % k == 0 or self._generation is None or self._generation.index != step // k
        self.vision_counter.reset()  # this step's encoder calls only (a later step of a generation: its update's)
        if fresh:  # a run resumed inside a generation replays it from the checkpoint (generation_state.py)
            self._generation = self._rollout_batch(step // k, resumed_inside=step % k != 0)
        gen = self._generation
        traj, scored, batch = gen.scored.trajectory, gen.scored, gen.batch
        rows = None if k == 1 else gen.part(step % k)
        rates = self.policy.learning_rates()  # the rates this update uses (the schedule moves on after it)
        losses = self.policy_update.run(traj, step, rows)
        self.draws.commit()  # trained on: a checkpoint from here on starts after these draws
        self.generation_state.track(gen, step + 1)
        sync = self.sampler.after_update()  # the new weights to vLLM every vllm_sync_steps steps
        first = fresh and not gen.restored  # the generation's first step (its logs, the guards' look at it)
        if first:  # a generation's reward and length numbers: each of its steps reports them
            gen.report = {**self.step_log.reward_metrics(scored), **self.step_log.trl_metrics(traj, rates, scored.logged)}
        metrics = self.ctx.mean_over_processes({
            **losses, **gen.report, **self.step_log.cost_metrics(traj, rates), **gen.engine_metrics, **gen.draw_metrics,
            "learning_rate": self.step_log.learning_rate(rates), **sync,
        })
        if first:
            self.step_log.keep_trl_logs(traj, batch.samples)
            metrics.update(self.watch.step(step, batch.samples, traj))  # after the update: guards read, never change
        metrics.update(step=step + 1, step_time=time.perf_counter() - started)  # a fresh step's rollout is inside
        if first:
            self.step_log.completions(step + 1, traj, batch.samples)
        return metrics

    def _rollout_batch(self, index: int, resumed_inside: bool = False) -> "Generation":
        """Rollout batch `index`: drawn (with dynamic sampling: refilled from further draws), scored, with the
        reference's and (when a later update or step is off-policy, or the engine's ratio needs them) the
        sampling policy's log-probs."""
        cfg = self.cfg
        started = time.perf_counter()
        first_step = index * cfg.steps_per_generation
        self.draws.start_generation(index, resumed_inside)
        saved = self.generation_state.take(index) if resumed_inside else None  # its draws are replayed as sampled
        self.draws.begin_step(first_step)
        if self.dynamic_sampling is None:
            draw = self.draws.next(first_step)
            batch, sampled, draw_metrics = draw.batch, draw.sampled, {}
            self.timings = {"rollout": time.perf_counter() - started}
            rewarded = self.scoring.rewards_of(batch.samples, batch.rows, sampled, first_step)
        else:  # the draws' rewards decide which groups stay
            filled = self.dynamic_sampling.fill(first_step, self.draws)
            batch, sampled, rewarded, draw_metrics = filled.batch, filled.sampled, filled.rewarded, filled.metrics
            self.timings = {"rollout": time.perf_counter() - started}
        draw_metrics.update(self.draws.metrics())
        scored = self.scoring.trajectory(batch.rows, sampled, rewarded)
        traj = scored.trajectory
        if saved is not None:  # what the generation's first step took with the weights of then
            for name, logps in saved.logps.items():
                setattr(traj, name, logps.to(traj.completion_ids.device))
            return Generation(index, batch, scored, saved.engine_metrics, saved.draw_metrics, saved.order,
                              cfg.steps_per_generation, report=saved.report, restored=True)
        traj.ref_logps = self.scorer.reference_logps(traj)
        correct = sampled.rollout.sampling_logps is not None and cfg.rollout.vllm_importance_sampling_correction
        # an asynchronous batch's one update: its own log-probs are the old ones, and the ratio is taken from them
        in_update = correct and cfg.rollout.asynchronous and cfg.num_iterations == 1
        if cfg.num_iterations > 1 or cfg.steps_per_generation > 1 or (correct and not in_update):
            traj.old_logps = self.scorer.sampling_policy_logps(traj)  # later updates are off-policy
        if in_update:
            traj.sampling_logps = sampled.rollout.sampling_logps
        engine_metrics = weigh_by_engine(traj, sampled.rollout.sampling_logps, cfg.rollout) \
            if correct and not in_update else {}
        engine_metrics = self.ctx.extremes_over_processes(engine_metrics)  # TRL's min of mins, max of maxes
        # TRL shuffles a generation before splitting it into steps (drawn only then: one step per generation takes
        # no random numbers here, so its runs stay as they were)
        order = torch.randperm(len(traj)).tolist() if cfg.steps_per_generation > 1 else list(range(len(traj)))
        return Generation(index, batch, scored, engine_metrics, draw_metrics, order, cfg.steps_per_generation)
