"""`GRPOTrainer` and `SFTTrainer`, TRL-shaped, and the only trainers: the CLI builds them from its settings
(`from_settings`), a script from TRL's arguments.

    trainer = GRPOTrainer(model="tiny:smolvlm", reward_funcs=[accuracy], args=GRPOConfig(max_steps=2),
                          train_dataset=dataset)
    trainer.train(); trainer.evaluate(); trainer.save_model(); trainer.push_to_hub("me/model")

Like TRL's, a trainer builds everything when it is made (the model loaded, the data read and checked, LoRA
applied), and `train()` runs. GRPO's step reads top-down in `GRPOTrainer.train_step`: B prompts -> G sampled
completions each (sampler) -> named rewards, advantages, the Trajectory (scoring) -> old / reference log-probs
(scorer) -> `num_iterations` updates of the registered loss (policy_update) -> metrics and completions (step_log).
It knows no family and names no loss or estimator: those are the adapter's and the registries' (grpo/algorithm/).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from vlm_grpo.api.trl_configs import GRPOConfig, SFTConfig
from vlm_grpo.api.stage import RunInputs, Stage
from vlm_grpo.api.trl_objects import reward_processing_list
from vlm_grpo.api.trl_arguments import settings_of
from vlm_grpo.api.trl_fields import LIGER
from vlm_grpo.api.trl_surface import settable
from vlm_grpo.grpo.algorithm.losses import Collective, EntropyControl, PolicyObjective
from vlm_grpo.grpo.algorithm.sampling_correction import weigh_by_engine
from vlm_grpo.grpo.data.order import step_seed
from vlm_grpo.grpo.distributed import fsdp
from vlm_grpo.grpo.parts.checkpointing import KeptUnder
from vlm_grpo.grpo.parts.sampled_evaluation import SampledEvaluation
from vlm_grpo.grpo.parts.sampler import Sampler
from vlm_grpo.grpo.parts.scoring import Scoring
from vlm_grpo.grpo.parts.step_log import StepLog
from vlm_grpo.grpo.parts.supervised_update import SupervisedUpdate
from vlm_grpo.grpo.parts.token_scorer import TokenScorer
from vlm_grpo.grpo.parts.update import PolicyUpdate
from vlm_grpo.grpo.tools.chat_format import ChatFormat
from vlm_grpo.grpo.tools.toolset import final_message_rewards, run_toolset
from vlm_grpo.grpo.guards.hacking_watch import HackingWatch
from vlm_grpo.grpo.training.lora import is_lora_wrapped
from vlm_grpo.grpo.training.vision_counter import VisionCounter


@dataclass
class Generation:
    """One rollout batch and what its steps share: the prompts, the scored trajectory, the engine's correction
    metrics, and the shuffled row order its steps split (steps_per_generation parts)."""

    index: int
    batch: Any
    scored: Any
    engine_metrics: dict[str, float]
    order: list[int]
    parts: int
    seconds: float  # time spent sampling and scoring it
    report: dict[str, float] = field(default_factory=dict)  # its reward and completion metrics, taken once

    def part(self, k: int) -> list[int]:
        size = len(self.order) // self.parts
        return self.order[k * size:(k + 1) * size]


class GRPOTrainer(Stage):
    """TRL's `GRPOTrainer(model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
    reward_processing_classes, callbacks, optimizers, peft_config, tools, environment_factory, rollout_func)`;
    `tools` are typed functions with Google-style docstrings (sync or async), `environment_factory` a class whose
    public methods are tools plus `reset()` and an optional `get_reward()` (or a dict of them), as in TRL 1.16."""

    stage = "grpo"
    evaluates_around = True
    config_class = GRPOConfig

    def __init__(self, model: Any, reward_funcs: Any = None, args: GRPOConfig | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Sequence[Any] | None = None, optimizers: tuple = (None, None), peft_config: Any = None,
                 tools: Sequence[Any] | None = None, environment_factory: Any = None, rollout_func: Any = None):
        args = args if args is not None else self.config_class()
        if getattr(args, "schedule", {}).get("use_liger_kernel"):
            raise ValueError(f"use_liger_kernel=True: {LIGER}")
        if train_dataset is None and environment_factory is None and not _names_data(args):
            raise ValueError("`train_dataset` is required: give the prompts as train_dataset (a datasets.Dataset or "
                             "a list of dicts), or name them in the settings (data.recipe, data.dataset)")
        if _streams(train_dataset):  # TRL's rules for an iterable train_dataset
            if args.accelerator_config.dispatch_batches:
                raise ValueError("Iterable datasets require `dispatch_batches=False` (accelerator_config): each "
                                 "process reads its own share of the stream")
            if args.dataloader_num_workers:  # workers would interleave the stream and split the prompt groups
                args.dataloader_num_workers = 0
        funcs = reward_funcs if reward_funcs is None or isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.reward_processing_classes = reward_processing_list(reward_processing_classes, len(funcs or []))
        self.eval_dataset = eval_dataset  # as given (TRL's attribute); the run reads it through the settings
        self.train_dataset_given, self.rollout_func = train_dataset, rollout_func
        cfg, recipe, given = settings_of(args, model, reward_funcs, train_dataset, eval_dataset, processing_class,
                                         reward_processing_classes, optimizers, peft_config)
        inputs = RunInputs(recipe=recipe, tools=list(tools or ()), environment_factory=environment_factory,
                           rollout_func=rollout_func, **given)
        self._build(cfg, inputs, args=args, callbacks=callbacks or ())

    # ---------------------------------------------------------------- the parts of GRPO's step
    def _build(self, cfg, inputs, args, callbacks) -> None:
        cfg.loss.max_completion_length = cfg.generation.max_new_tokens
        self.reference = None  # the frozen reference copy (None: LoRA's base serves, or no KL term)
        self.entropy_control = EntropyControl(cfg.loss)
        self.timings: dict[str, float] = {}  # seconds of the last step's phases (kept out of the metrics)
        self._generation: Generation | None = None  # the rollout batch the current steps train on
        super()._build(cfg, inputs, args, callbacks)

    def _after_freeze(self, adapter) -> None:
        if self.cfg.loss.beta > 0 and not is_lora_wrapped(adapter):
            # A frozen in-memory copy: never reloaded from disk by name.
            self.reference = copy.deepcopy(adapter.model).eval().requires_grad_(False)
        groups = adapter.module_groups()
        params = dict(adapter.model.named_parameters())
        # The features the rollout computed stay valid for every forward of the step only if nothing that
        # produces them trains (the projector included: features are taken after it).
        self.encoder_frozen = not any(params[n].requires_grad for g in ("vision", "projector") for n in groups[g])
        self.vision_counter = VisionCounter(adapter, [adapter.model] + ([self.reference] if self.reference is not None else []))
        # MoE: the routers' load-balancing loss joins the policy loss with this weight (0.0: not added)
        self.router_aux_coef = adapter.router_aux_loss_coef(self.cfg.loss.router_aux_loss_coef)

    def _shard_more(self, mode: str) -> None:
        if self.cfg.loss.sync_ref_model:
            raise ValueError("loss.sync_ref_model with FSDP: the reference's shards are not saved in sharded "
                             "checkpoints yet; train without fsdp, or without sync_ref_model")
        if self.reference is not None:
            self.reference = fsdp.shard(self.reference, mode)

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
        self.scorer = TokenScorer(ctx, policy, self.reference, self.encoder_frozen,
                                  entropy_trains=self.entropy_control.enabled, router_aux_coef=self.router_aux_coef)
        self.watch = HackingWatch(ctx, data, policy, score=self.scorer.policy_logps)  # the reward audit, now
        self.sampler = Sampler(ctx, policy, self.scorer, self.toolset, chat_format, inputs.rollout_func, owner=self)
        self.scoring = Scoring(ctx, data.rewards, self.scorer)
        # the loss, built once: the update's statistics cross processes and step the entropy control; the sampled
        # evaluation's are its own process's, and it leaves the entropy control alone (no update follows)
        collective = Collective(reduce_sum=lambda x: ctx.accelerator.reduce(x, reduction="sum"), gather=ctx.gather_tensor)
        objective = PolicyObjective(cfg.loss, entropy_control=self.entropy_control, collective=collective)
        self.policy_update = PolicyUpdate(ctx, policy, self.scorer, objective, self.reference)
        self.step_log = StepLog(ctx, data.rewards, policy, self.vision_counter, self.watch.flags)
        self.sampled_evaluation = SampledEvaluation(ctx, self.sampler, self.scoring, self.scorer,
                                                    PolicyObjective(cfg.loss))
        if cfg.rollout.uses_vllm and self.toolset.enabled:
            raise ValueError("rollout.engine vllm samples one turn; this run has tools (the recipe's or yours): use "
                             "rollout.engine transformers, or tools.recipe_tools false")
        return [self.policy_update, KeptUnder("guards", self.watch), KeptUnder("step_log", self.step_log)]

    def scheduler_steps(self) -> int:
        return self.cfg.max_steps * self.cfg.num_iterations

    def completions_per_prompt(self) -> int:
        return self.cfg.data.num_generations

    def sampled_metrics(self, rows, step: int) -> dict[str, float]:
        return self.sampled_evaluation.run(rows, step)  # sampled and scored as a training step's rollout is

    # ---------------------------------------------------------------- TRL's GRPOTrainer attributes
    @property
    def ref_model(self):
        """The frozen reference model (None: beta 0, or LoRA's base serves as the reference), TRL's name."""
        return self.reference

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient as it stands (adaptive: after the last update), TRL's attribute."""
        return self.entropy_control.coef

    @property
    def aux_loss_enabled(self) -> bool:
        """Whether the MoE routers' load-balancing loss joins the loss (TRL's attribute)."""
        return self.router_aux_coef > 0

    @settable
    def _logs(self) -> dict[str, Any]:
        """TRL's buffers of the last generation: prompt, completion, rewards (per function), advantages, extra
        (columns rewards logged with log_extra) and images (with log_multimodal)."""
        return self.step_log.trl_logs

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's method: the tokens at or above the `threshold` quantile of the entropies of every process's
        unmasked tokens."""
        from vlm_grpo.grpo.algorithm.losses.objective import Collective, high_entropy_mask

        gather = self.accelerator.gather if self.accelerator.num_processes > 1 else (lambda t: t)
        return high_entropy_mask(entropies, mask, threshold, Collective(gather=gather))

    @staticmethod
    def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
        """TRL's method: [N, 1], 0 for a negative-advantage sequence whose mean KL(sampling || policy) over its
        tokens exceeds the threshold."""
        from vlm_grpo.grpo.algorithm.losses.objective import off_policy_mask

        return off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold)

    def _generate(self, prompts: list) -> tuple:
        """TRL's rollout call with a rollout_func: (prompt_ids, completion_ids, tool_mask, logprobs, extra columns)
        of `prompts` (each prompt entry as the dataset wrote it), the output checked as the run checks it."""
        from vlm_grpo.grpo.rollout.custom import checked_output

        rollout_func = getattr(self, "rollout_func", None)
        if rollout_func is None:
            raise ValueError("_generate without a rollout_func: this trainer samples inside its step "
                             "(GRPOTrainer.train_step); give rollout_func to generate by your own function")
        output = checked_output(rollout_func(prompts, self))
        extra = {k: v for k, v in output.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        return output["prompt_ids"], output["completion_ids"], output.get("env_mask"), output["logprobs"], extra

    def progress_postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward']:.3f}", "kl": f"{metrics.get('kl', 0.0):.2e}"}

    def halted(self) -> str | None:
        return self.watch.halt

    # ---------------------------------------------------------------- the GRPO step, top-down
    def train_step(self, step: int) -> dict[str, Any]:
        """rollout -> rewards -> advantages -> old / reference log-probs -> `num_iterations` updates. With
        steps_per_generation k > 1 a rollout batch is sampled every k steps and each step trains on its part."""
        cfg = self.cfg
        started = time.perf_counter()
        k = cfg.steps_per_generation
        fresh = step % k == 0 or self._generation is None or self._generation.index != step // k
        if fresh:  # a resumed run in mid-generation samples that generation again, from its own seed
            self._generation = self._rollout_batch(step // k)
        gen = self._generation
        traj, scored, batch = gen.scored.trajectory, gen.scored, gen.batch
        rows = None if k == 1 else gen.part(step % k)
        rates = self.policy.learning_rates()  # the rates this update uses (the schedule moves on after it)
        losses = self.policy_update.run(traj, step, rows)
        self.sampler.after_update()  # the new weights to vLLM every vllm_sync_steps steps
        if fresh:  # a generation's reward and length numbers: each of its steps reports them
            gen.report = {**self.step_log.reward_metrics(scored), **self.step_log.trl_metrics(traj, rates, scored.logged)}
        metrics = self.ctx.mean_over_processes({
            **losses, **gen.report, **self.step_log.cost_metrics(traj, rates), **gen.engine_metrics,
            "learning_rate": self.step_log.learning_rate(rates),
        })
        if fresh:
            self.step_log.keep_trl_logs(traj, batch.samples)
            metrics.update(self.watch.step(step, batch.samples, traj))  # after the update: guards read, never change
        metrics.update(step=step + 1, step_time=time.perf_counter() - started + (gen.seconds if fresh else 0.0))
        if fresh:
            self.step_log.completions(step + 1, traj, batch.samples)
        return metrics

    def _rollout_batch(self, index: int) -> "Generation":
        """Rollout batch `index`: sampled, scored, with the reference's and (when a later update or step is
        off-policy, or the engine's ratio needs them) the sampling policy's log-probs."""
        cfg = self.cfg
        started = time.perf_counter()
        first_step = index * cfg.steps_per_generation
        torch.manual_seed(step_seed(cfg.seed, first_step, self.ctx.accelerator.process_index))
        batch = self.data.batch(index)
        self.vision_counter.reset()
        sampled = self.sampler.sample(batch.samples, batch.rows, first_step)
        self.timings = {"rollout": time.perf_counter() - started}
        scored = self.scoring.score(batch.samples, batch.rows, sampled, first_step)
        traj = scored.trajectory
        traj.ref_logps = self.scorer.reference_logps(traj)
        correct = sampled.rollout.sampling_logps is not None and cfg.rollout.vllm_importance_sampling_correction
        if cfg.num_iterations > 1 or cfg.steps_per_generation > 1 or correct:
            traj.old_logps = self.scorer.policy_logps(traj)  # later updates are off-policy
        engine_metrics = weigh_by_engine(traj, sampled.rollout.sampling_logps, cfg.rollout) if correct else {}
        # TRL shuffles a generation before splitting it into steps (drawn only then: one step per generation takes
        # no random numbers here, so its runs stay as they were)
        order = torch.randperm(len(traj)).tolist() if cfg.steps_per_generation > 1 else list(range(len(traj)))
        return Generation(index, batch, scored, engine_metrics, order, cfg.steps_per_generation,
                          time.perf_counter() - started)


def _streams(data: Any) -> bool:
    """An iterable (streaming) dataset: no length, rows read in order."""
    from datasets import IterableDataset

    return isinstance(data, IterableDataset)


def _names_data(args) -> bool:
    """Whether the settings name the training prompts without a train_dataset argument: a dataset, a recipe given as
    a keyword, or a settings file (which may name either)."""
    if args.train_config.data.dataset is not None or args.config_file is not None:
        return True
    given, section = args.given, args.given.get("data")
    return "recipe" in given or "data.recipe" in given or (isinstance(section, dict) and "recipe" in section)


class SFTTrainer(Stage):
    """TRL's `SFTTrainer(model, args, data_collator, train_dataset, eval_dataset, processing_class, callbacks,
    optimizers, peft_config)` over vlm-grpo's supervised warm-up: the loss is on each row's `completion` only.
    `reward_funcs` (optional) score the held-out evaluations."""

    stage = "sft"
    dropout = True
    needs_rewards = False
    config_class = SFTConfig

    def __init__(self, model: Any, args: SFTConfig | None = None, data_collator: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, callbacks: Sequence[Any] | None = None,
                 optimizers: tuple = (None, None), peft_config: Any = None, reward_funcs: Any = None):
        if data_collator is not None:
            raise ValueError("data_collator: batches are built by the model's adapter (prompts and images encoded "
                             "once, the completion appended); give data_collator=None")
        args = args if args is not None else self.config_class()
        cfg, recipe, given = settings_of(args, model, reward_funcs, train_dataset, eval_dataset, processing_class,
                                         None, optimizers, peft_config)
        self._build(cfg, RunInputs(recipe=recipe, **given), args=args, callbacks=callbacks or ())

    def _assemble_step(self, inputs: RunInputs) -> list:
        self.supervised_update = SupervisedUpdate(self.ctx, self.policy, self.evaluation)
        return []

    def completion_budget(self) -> int:
        return self.cfg.sft.max_reference_tokens

    def train_step(self, step: int) -> dict[str, Any]:
        torch.manual_seed(step_seed(self.cfg.seed, step, self.ctx.accelerator.process_index))  # dropout: same on resume
        return self.supervised_update.run(self.data.batch(step).samples, step)
