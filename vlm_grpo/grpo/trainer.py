"""The GRPO stage. It asks the adapter for everything model-specific and knows no family, and names no loss or
advantage estimator: those are registered parts (grpo/algorithm/).

`train_step` reads top-down: pick B prompts -> encode them once -> sample G completions each -> score them (named
rewards) -> advantages -> the Trajectory record -> old / reference log-probs -> `num_iterations` updates of the
registered loss, each over whole-group micro-batches.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import torch

from vlm_grpo.adapters.sharing import image_features
from vlm_grpo.grpo.algorithm import reference_sync
from vlm_grpo.grpo.algorithm.advantages import ADVANTAGES, reward_scores
from vlm_grpo.grpo.algorithm.losses import Collective, EntropyControl, policy_loss
from vlm_grpo.grpo.algorithm.sampling_correction import weigh_by_engine
from vlm_grpo.grpo.algorithm.trajectory import Trajectory, model_tokens
from vlm_grpo.grpo.data.order import step_seed
from vlm_grpo.grpo.distributed import fsdp
from vlm_grpo.grpo.logprobs.completions import group_scores
from vlm_grpo.grpo.rewards.inputs import RewardInputs, trainer_state
from vlm_grpo.grpo.rewards.scoring import nan_mean, nan_std, score
from vlm_grpo.grpo.rollout.custom import custom_rollout
from vlm_grpo.grpo.rollout.sampling import Rollout, encode, rollout
from vlm_grpo.grpo.rollout.turns import ToolRollout
from vlm_grpo.grpo.run.completion_files import completion_rows, prompt_media, save_step
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.tools.chat_format import ChatFormat
from vlm_grpo.grpo.tools.toolset import final_message_rewards, run_toolset
from vlm_grpo.grpo.training import gradient_checkpointing as checkpointing
from vlm_grpo.grpo.training.base import BaseTrainer
from vlm_grpo.grpo.training.before_after import BeforeAfter
from vlm_grpo.grpo.training.hacking_watch import HackingWatch
from vlm_grpo.grpo.training.lora import is_lora_wrapped, reference_disabled
from vlm_grpo.grpo.training.optimizer import update_step
from vlm_grpo.grpo.training.policy import sampling_with
from vlm_grpo.grpo.training.vision_counter import VisionCounter

log = logging.getLogger(__name__)


def _rows(x: torch.Tensor | None, rows: list[int]) -> torch.Tensor | None:
    return None if x is None else x[rows]


class GRPOTrainer(BeforeAfter, BaseTrainer):
    """The run plumbing (run dir, policy, freeze/LoRA, optimizer, checkpoints, loop) is BaseTrainer's. `tools` /
    `environment_factory`: TRL 1.16's arguments, added to the settings' tools / replacing their environment."""

    stage = "grpo"

    def __init__(self, cfg: TrainConfig, adapter=None, recipe=None, after_run=(), tools=(), environment_factory=None,
                 rollout_func=None, **parts):
        cfg.loss.max_completion_length = cfg.generation.max_new_tokens
        self.reference = None
        self.rollout_func = rollout_func  # TRL's rollout_func: the user's generation (rollout/custom.py)
        self.timings: dict[str, float] = {}  # seconds of the last step's phases (kept out of the metrics)
        self.updates = 0  # optimizer updates so far (the reference sync counts them)
        self.entropy_control = EntropyControl(cfg.loss)
        super().__init__(cfg, adapter=adapter, recipe=recipe, after_run=after_run, **parts)
        t = cfg.tools
        self.toolset = run_toolset(self.recipe, t.tools, t.environment, recipe_tools=t.recipe_tools,
                                   timeout=t.tool_timeout, tools=tools, environment_factory=environment_factory,
                                   isolation=t.isolation, on_error=t.on_tool_error)
        if self.toolset.enabled:  # a recipe written for one answer reads the final message of a multi-turn rollout
            self.rewards = final_message_rewards(self.recipe, self.rewards)
        self.rewards += self.toolset.rewards()  # an environment's get_reward (TRL: named after its class)
        self.chat_format = ChatFormat(self.adapter) if self.toolset.enabled else None
        self.session = None  # the step's tool session (environments, tools per rollout)
        self._rows: list[int] | None = None
        self.collective = Collective(reduce_sum=lambda x: self.accelerator.reduce(x, reduction="sum"),
                                     gather=self._gather_tensor)
        self.watch = HackingWatch(self)  # the reward audit now; each step the hacking and grounding monitors
        self.engine = None  # rollout.engine vllm: opened at the first rollout (after any resume), rollout/vllm_engine.py
        if cfg.rollout.uses_vllm and self.toolset.enabled:
            raise ValueError("rollout.engine vllm samples one turn; this run has tools (the recipe's or yours): use "
                             "rollout.engine transformers, or tools.recipe_tools false")

    # ---------------------------------------------------------------- hooks
    def _after_freeze(self) -> None:
        if self.cfg.loss.beta > 0 and not is_lora_wrapped(self.adapter):
            # A frozen in-memory copy: never reloaded from disk by name.
            self.reference = copy.deepcopy(self.adapter.model).eval().requires_grad_(False)
        groups = self.adapter.module_groups()
        params = dict(self.adapter.model.named_parameters())
        # The features the rollout computed stay valid for every forward of the step only if nothing that
        # produces them trains (the projector included: features are taken after it).
        self.encoder_frozen = not any(params[n].requires_grad for g in ("vision", "projector") for n in groups[g])
        models = [self.adapter.model] + ([self.reference] if self.reference is not None else [])
        self.vision_counter = VisionCounter(self.adapter, models)
        # MoE: the routers' load-balancing loss joins the policy loss with this weight (0.0: not added)
        self.router_aux_coef = self.adapter.router_aux_loss_coef(self.cfg.loss.router_aux_loss_coef)

    def _shard_more(self) -> None:
        if self.cfg.loss.sync_ref_model:
            raise ValueError("loss.sync_ref_model with FSDP: the reference's shards are not saved in sharded "
                             "checkpoints yet; train without fsdp, or without sync_ref_model")
        if self.reference is not None:
            self.reference = fsdp.shard(self.reference, self.sharding)

    def scheduler_steps(self) -> int:
        return self.cfg.max_steps * self.cfg.num_iterations

    def progress_postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward']:.3f}", "kl": f"{metrics.get('kl', 0.0):.2e}"}

    def extra_state(self) -> dict[str, Any]:
        return {"optimizer_updates": self.updates, "entropy_control": self.entropy_control.state_dict(),
                "guards": self.watch.state_dict()}

    def load_extra_state(self, state: dict[str, Any], checkpoint) -> None:
        self.updates = int(state.get("optimizer_updates", 0))
        if "entropy_control" in state:
            self.entropy_control.load_state_dict(state["entropy_control"])
        if "guards" in state:
            self.watch.load_state_dict(state["guards"])
        if self.cfg.loss.sync_ref_model:
            reference_sync.load(self.reference, checkpoint)

    def save_extra(self, directory) -> None:
        if self.cfg.loss.sync_ref_model:  # the reference has moved away from the starting model: keep it
            reference_sync.save(self.reference, directory)

    # ---------------------------------------------------------------- the GRPO step, top-down
    def train_step(self, step: int) -> dict[str, Any]:
        """rollout -> rewards -> advantages -> old / reference log-probs -> `num_iterations` updates."""
        cfg = self.cfg
        started = time.perf_counter()
        torch.manual_seed(step_seed(cfg.seed, step, self.accelerator.process_index))
        samples, indices = self._samples(step)
        self._rows = list(indices)  # the samples' dataset rows, for messages naming where user code failed
        self.vision_counter.reset()
        ro, policy_features = self.sample(samples)
        self.timings = {"rollout": time.perf_counter() - started}
        traj, reward_errors, reward_metrics = self.score(samples, indices, ro, step)
        traj.policy_features = policy_features
        traj.ref_logps = self._reference_logprobs(traj)
        correct = ro.sampling_logps is not None and cfg.rollout.vllm_importance_sampling_correction
        if cfg.num_iterations > 1 or correct:  # later updates are off-policy / the engine's ratio needs the trainer's
            with torch.no_grad():
                traj.old_logps = self._logprobs(traj, list(range(len(traj))), self.model)
        engine_metrics = weigh_by_engine(traj, ro.sampling_logps, cfg.rollout) if correct else {}
        losses = self.update(traj)
        if self.engine is not None:
            self.engine.after_update()  # the new weights to vLLM every vllm_sync_steps steps
        metrics = self._mean_over_processes({
            **losses, **self._reward_metrics(traj, reward_errors, reward_metrics), **self._cost_metrics(traj),
            **engine_metrics,
        })
        metrics.update(self.watch.step(step, samples, traj))  # after the update: guards read, never change, the step
        metrics.update(step=step + 1, step_time=time.perf_counter() - started)
        self._log_completions(step + 1, traj, samples)
        return metrics

    def sample(self, samples) -> tuple[Rollout, Any]:
        """B prompts, encoded once, and G sampled completions each; with encode-once, the policy's own image features
        (with gradient) taken first, which the rollout samples from (detached) and the single update reuses."""
        cfg, g, device = self.cfg, self.cfg.data.num_generations, self.accelerator.device
        self.session = self.toolset.start(samples, g, rows=self._rows, step=self.step + 1).format(self.chat_format) \
            if self.toolset.enabled else None
        with self.accelerator.autocast(), sampling_with(self.adapter.model, cfg.generation):  # the policy's precision
            prompts = encode(self.adapter, samples, device, self.session)
            policy_features = image_features(self.adapter, prompts, model=self.model) if self._encode_once() else None
            sampled_from = None if policy_features is None else policy_features.detach()
            if cfg.rollout.uses_vllm:  # vLLM samples; the trainer encoded the prompts for its own forwards
                return self._engine().rollout(samples, prompts, cfg.generation, g, device), policy_features
            args, turns = (self.adapter, samples, cfg.generation, g, device), cfg.tools.max_tool_calling_iterations
            if self.rollout_func is not None:
                return custom_rollout(self.rollout_func, self, self.adapter, samples, prompts, g), policy_features
            ro = self.with_full_weights(lambda: rollout(
                *args, shared_prefix=cfg.perf.shared_prefix, prompts=prompts, features=sampled_from,
            ) if self.session is None else ToolRollout.sample(  # multi-turn: tool images encoded once each
                *args, self.session, self.chat_format, prompts, features=sampled_from, max_iterations=turns,
                shared_prefix=cfg.perf.shared_prefix, encoder=self.model if policy_features is not None else None))
        return ro, policy_features

    def _engine(self):
        if self.engine is None:
            from vlm_grpo.grpo.rollout.engines import open_engine

            self.engine = open_engine(self.adapter, self.cfg, self.accelerator.device)
        return self.engine

    def score(self, samples, indices, ro: Rollout, step: int):
        """The rollout scored: rewards per component, the loss mask, and advantages, as one Trajectory."""
        cfg, g = self.cfg, self.cfg.data.num_generations
        inputs = RewardInputs.from_samples(samples, g, ro.completions, ro.completion_ids, ro.completion_mask,
                                           trainer_state(step, cfg.max_steps))
        if ro.conversations is not None:  # rewards get the whole conversation, as TRL passes it
            inputs.with_tools(self.session, ro.conversations)
        inputs.rows = [indices[i // g] for i in range(len(inputs))]
        inputs.fields.update(ro.extra_fields)  # a rollout_func's own columns, as TRL hands them to the rewards
        reward_errors: dict[str, int] = {}
        total, components = score(self.rewards, inputs, on_error=cfg.data.on_reward_error, errors=reward_errors,
                                  timeout=cfg.data.reward_timeout or None)
        loss_mask = model_tokens(ro.completion_mask, ro.tool_mask)  # tool turns train on no token
        if cfg.loss.mask_truncated_completions:  # a completion cut at the length limit trains on no token
            loss_mask = loss_mask * (~ro.truncated).unsqueeze(1).to(loss_mask.dtype)
        scores = reward_scores(components, [r.weight for r in self.rewards], g, cfg.multi_objective_aggregation)
        advantages, metrics = ADVANTAGES[cfg.advantage]().estimate(scores, loss_mask, cfg)
        traj = Trajectory(
            prompts=ro.prompts, sample_indices=indices, prompt_texts=ro.prompt_texts, completions=ro.completions,
            completion_ids=ro.completion_ids, completion_mask=ro.completion_mask, loss_mask=loss_mask,
            rewards=total, reward_components=components, advantages=advantages.to(self.accelerator.device),
            num_generations=g, features=ro.features, stats=ro.stats,
            extra={k: v for k, v in inputs.extra_columns.items() if len(v) == len(ro.completions)},
            tool_mask=ro.tool_mask, completion_images=ro.completion_images, conversations=ro.conversations,
            tool_metrics=ro.tool_metrics,
        )
        if traj.completion_images is not None and self._encode_once():
            traj.completion_images.policy_features = ro.turn_features  # with gradient, for the single update
        metrics["logged"] = inputs.logged_metrics
        return traj, reward_errors, metrics

    def update(self, traj: Trajectory) -> dict[str, float]:
        """`num_iterations` optimizer updates on the trajectory, each over whole-group micro-batches; the metrics
        averaged over updates and micro-batches."""
        cfg, acc = self.cfg, self.accelerator
        chunks = traj.micro_batches(cfg.gradient_accumulation_steps)
        # the step's training tokens per process (step_tokens losses; DDP averages gradients over processes)
        tokens = acc.reduce(traj.loss_mask.sum().float(), reduction="sum") / acc.num_processes
        sums: dict[str, float] = {}
        skipped = 0
        for _ in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for k, rows in enumerate(chunks):
                with self.accumulating(last=k == len(chunks) - 1):
                    logps, entropy, aux = self._logprobs(traj, rows, self.model, with_entropy=True,
                                                         features=traj.policy_features, router_aux=True)
                    loss, metrics = policy_loss(
                        logps, _rows(traj.old_logps, rows), _rows(traj.ref_logps, rows), traj.advantages[rows],
                        traj.loss_mask[rows], cfg.loss, entropy=entropy, normalizer=tokens,
                        share=len(rows) / len(traj), entropy_control=self.entropy_control, collective=self.collective,
                        sampling_logps=_rows(traj.sampling_logps, rows), sampling_ratio=_rows(traj.sampling_ratio, rows),
                    )
                    if aux is not None:  # MoE (TRL's rule): + coef x the routers' load-balancing loss, per micro-batch
                        loss = loss + self.router_aux_coef * aux / len(chunks)
                        metrics["aux_loss"] = aux.item()
                    acc.backward(loss)
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(value) * len(rows) / len(traj) / cfg.num_iterations
            grad_norm, was_skipped = update_step(acc, self.optimizer, cfg.optim)
            if was_skipped:
                skipped += 1
                log.warning("step %d: non-finite gradient norm, update skipped", self.step)
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.entropy_control.end_update(self.collective.reduce_sum)
            if self.entropy_control.enabled:  # TRL logs the coefficient as it stands after the update
                sums["entropy_coef"] = sums.get("entropy_coef", 0.0) + self.entropy_control.coef / cfg.num_iterations
            self.updates += 1
            if cfg.loss.sync_ref_model and self.updates % cfg.loss.ref_model_sync_steps == 0:
                reference_sync.mix(self.reference, self.adapter.model, cfg.loss.ref_model_mixup_alpha)
        return {**sums, "grad_norm": float(grad_norm), "skipped_updates": skipped}

    # ---------------------------------------------------------------- log-probs
    def _reuse_features(self) -> bool:
        perf = self.cfg.perf
        return (perf.share_image_features and perf.reuse_frozen_features and self.encoder_frozen
                and self.adapter.shares_features)  # the adapter proved the shared-features path for this model

    def _encode_once(self) -> bool:
        """Whether the policy's features, with gradient, can be computed before the rollout and serve both it and
        the update: the encoder trains (else the rollout's no-grad features serve), the policy runs one forward
        at the rollout's weights (one update, one micro-batch) and nothing drops the graph in between
        (gradient checkpointing, resharding)."""
        cfg, perf = self.cfg, self.cfg.perf
        return (perf.encode_once and perf.shared_prefix and perf.share_image_features and self.adapter.shares_features
                and not self.encoder_frozen
                and cfg.num_iterations == 1 and cfg.gradient_accumulation_steps == 1
                and not perf.gradient_checkpointing and not fsdp.is_sharded(self.model))

    def _step_features(self, traj: Trajectory):
        """The step's image features when they may be reused (frozen encoder): the rollout's, or encoded once."""
        if not self._reuse_features():
            return None
        if traj.features is None:
            with torch.no_grad():
                traj.features = self.forward(lambda m: image_features(self.adapter, traj.prompts, model=m)).detach()
        return traj.features

    def _logprobs(self, traj: Trajectory, rows: list[int], model, with_entropy: bool = False, features=None,
                  router_aux: bool = False):
        """`features`: the prompts' image features to use (the policy's, taken with gradient before the rollout);
        None: the step's reusable ones, or else encoded in the forward. `router_aux`: (logps, entropy, the MoE
        routers' load-balancing loss of these rows, None when the run adds none)."""
        perf = self.cfg.perf
        context = self.accelerator.autocast if model is self.model else None
        turns = None if traj.completion_images is None else traj.completion_images.select(rows)
        turn_features = None  # the tool images' features; None: encoded in the forward
        if turns is not None and features is not None:  # the policy's, with gradient, as the prompts' are
            turn_features = turns.policy_features
        elif turns is not None and self._reuse_features():  # the rollout's (a frozen encoder)
            turn_features = turns.features
        features = self._step_features(traj) if features is None else features

        def scores(inner):  # returns tensors: a sharded root registers its backward hooks on them
            with checkpointing.active(inner, perf.gradient_checkpointing):
                out = group_scores(
                    self.adapter, traj.prompts, traj.prompt_index(rows), traj.completion_ids[rows],
                    traj.completion_mask[rows], inner, share_features=perf.share_image_features, features=features,
                    turns=turns, turn_features=turn_features, context=context,
                    share_prompt=perf.share_prompt and not perf.gradient_checkpointing,
                    temperature=self.cfg.generation.temperature, with_entropy=with_entropy,
                    entropy_grad=with_entropy and self.entropy_control.enabled,  # the bonus trains on the entropy
                    chunk_bytes=perf.logprob_chunk_mb * 2**20,
                    router_aux=router_aux and self.router_aux_coef > 0,
                )
            return out.logps, out.entropy, out.aux_loss

        logps, entropy, aux = self.forward(scores, model)
        if router_aux:
            return logps, entropy, aux
        return (logps, entropy) if with_entropy else logps

    def _reference_logprobs(self, traj: Trajectory) -> torch.Tensor | None:
        if self.cfg.loss.beta <= 0:
            return None
        rows = list(range(len(traj)))
        with torch.no_grad():
            if self.reference is not None:
                return self._logprobs(traj, rows, self.reference)
            with reference_disabled(self.adapter):  # the policy itself (through its wrapper), LoRA off
                return self._logprobs(traj, rows, self.model)

    # ---------------------------------------------------------------- metrics and logs
    def _reward_metrics(self, traj: Trajectory, errors: dict[str, int], metrics: dict[str, Any]) -> dict[str, float]:
        logged = metrics.pop("logged")
        return {
            # a reward's None (not applicable) is NaN: means and stds are over the values present, as in TRL
            "reward": nan_mean(traj.rewards),
            "reward_std": nan_std(traj.rewards),
            **{f"rewards/{name}": nan_mean(v) for name, v in traj.reward_components.items()},
            **{f"reward_metrics/{name}": sum(v) / len(v) for name, v in logged.items() if v},
            **{k: float(v) for k, v in metrics.items() if k not in ("reward_mean", "reward_std")},
            "completion_length": traj.model_tokens().sum(1).float().mean().item(),  # the model's own tokens
            **{f"tools/{k}": v for k, v in traj.tool_metrics.items()},
            **{f"reward_errors/{r.name}": errors.get(r.name, 0) for r in self.rewards
               if self.cfg.data.on_reward_error == "zero"},
        }

    def _cost_metrics(self, traj: Trajectory) -> dict[str, float]:
        return {
            **{f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups},
            "perf/vision_calls": self.vision_counter.calls,
            "perf/vision_images": self.vision_counter.images,
            "perf/prefill_tokens": traj.stats["prefill_tokens"],
            "perf/decode_tokens": traj.stats["decode_tokens"],
        }

    def _log_completions(self, step: int, traj: Trajectory, samples) -> None:
        """completions.jsonl, completions/completions_NNNNN.parquet and the trackers' tables; with log_multimodal, each
        prompt's images and video frames saved under completions/images/ and referenced from its rows."""
        if not self.cfg.logging.log_completions:
            return
        process = self.accelerator.process_index
        rows = completion_rows(traj, step, process, self.watch.flags)
        rows = self._gather_rows(rows)
        media = None
        if self.cfg.logging.log_multimodal:  # the pictures travel to the main process, which saves them
            media = self._gather_rows([{"process": process, "group": k, **prompt_media(s)} for k, s in enumerate(samples)])
        if self.is_main:
            rows = save_step(self.run_dir, step, rows, media)
        self.log.completions(rows)
        self.trackers.completions(rows, step)

    def _gather_rows(self, rows: list[dict]) -> list[dict]:
        if self.accelerator.num_processes == 1:
            return rows
        from accelerate.utils import gather_object

        return gather_object(rows)

    def _gather_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """1-D tensors of any length from every process, concatenated."""
        if self.accelerator.num_processes == 1:
            return x
        sizes = self.accelerator.gather(torch.tensor([x.numel()], device=x.device))
        padded = self.accelerator.pad_across_processes(x, dim=0)
        gathered = self.accelerator.gather(padded).view(len(sizes), -1)
        return torch.cat([row[: int(n)] for row, n in zip(gathered, sizes)])
