"""The shared GRPO loop. It asks the adapter for everything model-specific and knows no family.

One step: pick B prompts -> encode once -> sample G completions each -> score (named rewards) ->
group advantages -> log-probs (old, reference) -> `num_iterations` clipped-ratio updates.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import Any

import torch

from vlm_grpo.adapters.sharing import image_features
from vlm_grpo.grpo.training import gradient_checkpointing as checkpointing
from vlm_grpo.grpo.distributed import fsdp
from vlm_grpo.grpo.algorithm.advantages.group import group_advantages
from vlm_grpo.grpo.training.base import BaseTrainer
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.training.vision_counter import VisionCounter
from vlm_grpo.grpo.data.order import step_seed
from vlm_grpo.grpo.evaluate import format_report, heldout_metrics, side_by_side, write_report
from vlm_grpo.grpo.logprobs.completions import group_scores
from vlm_grpo.grpo.training.lora import is_lora_wrapped, reference_disabled
from vlm_grpo.grpo.algorithm.losses.base import grpo_loss
from vlm_grpo.grpo.training.optimizer import update_step
from vlm_grpo.grpo.rewards.inputs import RewardInputs, trainer_state
from vlm_grpo.grpo.rewards.scoring import nan_mean, nan_std, score
from vlm_grpo.grpo.rollout.sampling import Rollout, encode, rollout

log = logging.getLogger(__name__)
SIDE_BY_SIDE_SHOWN = 6  # held-out pairs printed at the end of a run with eval.before_after


def _loggable(value: Any) -> Any:
    """A value a reward logged, as completions.jsonl can hold it (anything but plain scalars as text)."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


class GRPOTrainer(BaseTrainer):
    """The run plumbing (run dir, policy, freeze/LoRA, optimizer, checkpoints, loop) is BaseTrainer's."""

    stage = "grpo"

    def __init__(self, cfg: TrainConfig, adapter=None, recipe=None, after_run=()):
        cfg.loss.max_completion_length = cfg.generation.max_new_tokens
        self.reference = None
        self.timings: dict[str, float] = {}  # seconds of the last step's phases (kept out of the metrics)
        super().__init__(cfg, adapter=adapter, recipe=recipe, after_run=after_run)

    # ---------------------------------------------------------------- held-out evaluation around the run
    def _heldout(self, when: str, step: int) -> dict[str, Any]:
        """Greedy evaluation (eval section) written to eval-<when>.json and logged as a metrics row."""
        report = self.evaluate(step)
        if self.is_main:
            report["model"] = self.cfg.model.init_from or self.cfg.model.name
            report["step"] = step
            write_report(report, self.run_dir / f"eval-{when}.json")
            self.log.metrics({"step": step, "stage": f"eval-{when}", **heldout_metrics(report)})
            print(f"\nheld-out evaluation {when} GRPO (step {step}):\n{format_report(report)}")
        self.heldout[when] = report
        self.track(heldout_metrics(report), step)
        return report

    def train(self) -> list[dict[str, Any]]:
        """The GRPO loop; with eval.before_after, a held-out evaluation before the first and after the last step."""
        from vlm_grpo.grpo.run.checkpoints import latest_checkpoint

        cfg = self.cfg
        if not cfg.eval.before_after:
            return super().train()
        resuming = cfg.resume_from is not None or (cfg.resume and latest_checkpoint(self.run_dir) is not None)
        self.start_trackers()
        if not resuming:
            before = self._heldout("before", 0)
        elif (self.run_dir / "eval-before.json").is_file():  # a resumed run evaluated it the first time
            before = self.heldout["before"] = json.loads((self.run_dir / "eval-before.json").read_text())
        else:
            before = None
        history = super().train(finish=False)
        if history and history[-1]["step"] == cfg.max_steps:
            after = self._heldout("after", cfg.max_steps)
            if before is not None and self.is_main:
                self._report_before_after(before, after)
            self.run_after_hooks()  # again, now with the after point
            self.finish()
        return history

    def _report_before_after(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """The same held-out samples answered before and after GRPO: all in the run directory, a few on screen."""
        path = self.run_dir / "before-after.txt"
        path.write_text(side_by_side(before, after) + "\n")
        print(f"\nthe same held-out samples, greedy, before and after GRPO (all {after['size']} in {path}):\n")
        print(side_by_side(before, after, limit=SIDE_BY_SIDE_SHOWN))
        if before["accuracy"] is not None:
            print(
                f"\nheld-out accuracy ({after['size']} {self.cfg.eval.split} samples): "
                f"{before['accuracy']:.1%} before -> {after['accuracy']:.1%} after {self.cfg.max_steps} GRPO steps"
            )

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

    def _shard_more(self) -> None:
        if self.reference is not None:
            self.reference = fsdp.shard(self.reference, self.sharding)

    def scheduler_steps(self) -> int:
        return self.cfg.max_steps * self.cfg.num_iterations

    def progress_postfix(self, metrics: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{metrics['reward']:.3f}", "kl": f"{metrics.get('kl', 0.0):.2e}"}

    # ---------------------------------------------------------------- one step
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

    def _step_features(self, ro: Rollout):
        """The step's image features when they may be reused (frozen encoder): the rollout's, or encoded once."""
        if not self._reuse_features():
            return None
        if ro.features is None:
            with torch.no_grad():
                ro.features = self.forward(lambda m: image_features(self.adapter, ro.prompts, model=m)).detach()
        return ro.features

    def _logprobs(self, ro: Rollout, rows: list[int], model, with_entropy: bool = False, features=None):
        """`features`: the prompts' image features to use (the policy's, taken with gradient before the rollout);
        None: the step's reusable ones, or else encoded in the forward."""
        perf = self.cfg.perf
        context = self.accelerator.autocast if model is self.model else None
        features = self._step_features(ro) if features is None else features

        def scores(inner):  # returns tensors: a sharded root registers its backward hooks on them
            with checkpointing.active(inner, perf.gradient_checkpointing):
                out = group_scores(
                    self.adapter, ro.prompts, ro.prompt_index(rows), ro.completion_ids[rows], ro.completion_mask[rows],
                    inner, share_features=perf.share_image_features, features=features, context=context,
                    share_prompt=perf.share_prompt and not perf.gradient_checkpointing,
                    temperature=self.cfg.generation.temperature, with_entropy=with_entropy,
                    chunk_bytes=perf.logprob_chunk_mb * 2**20,
                )
            return out.logps, out.entropy

        logps, entropy = self.forward(scores, model)
        return (logps, entropy) if with_entropy else logps

    def _reference_logprobs(self, ro: Rollout, rows: list[int]) -> torch.Tensor | None:
        if self.cfg.loss.beta <= 0:
            return None
        with torch.no_grad():
            if self.reference is not None:
                return self._logprobs(ro, rows, self.reference)
            with reference_disabled(self.adapter):  # the policy itself (through its wrapper), LoRA off
                return self._logprobs(ro, rows, self.model)

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
        self.vision_counter.reset()
        rollout_started = time.perf_counter()
        with acc.autocast():  # sample in the precision the policy forward runs in (a no-op without mixed precision)
            prompts = encode(self.adapter, samples, acc.device)
            policy_features = image_features(self.adapter, prompts, model=self.model) if self._encode_once() else None
            sampled_from = None if policy_features is None else policy_features.detach()
            ro = self.with_full_weights(lambda: rollout(
                self.adapter, samples, cfg.generation, cfg.data.num_generations, acc.device,
                shared_prefix=cfg.perf.shared_prefix, prompts=prompts, features=sampled_from,
            ))
        self.timings = {"rollout": time.perf_counter() - rollout_started}
        reward_errors: dict[str, int] = {}
        inputs = RewardInputs.from_samples(samples, cfg.data.num_generations, ro.completions, ro.completion_ids,
                                           ro.completion_mask, trainer_state(step, cfg.max_steps))
        total, components = score(self.rewards, inputs, on_error=cfg.data.on_reward_error, errors=reward_errors)
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
                with self.accumulating(last=k == len(chunks) - 1):
                    logps, entropy = self._logprobs(ro, chunk, self.model, with_entropy=True, features=policy_features)
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
                    loss_metrics = {**loss_metrics, "loss": loss.item(), "entropy": masked_mean(entropy, mask[chunk]).item()}
                for key, value in loss_metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(value) * len(chunk) / len(rows) / cfg.num_iterations
            grad_norm, was_skipped = update_step(acc, self.optimizer, cfg.optim)
            if was_skipped:
                skipped += 1
                log.warning("step %d: non-finite gradient norm, update skipped", step)
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        metrics = {
            **sums,
            # a reward's None (not applicable) is NaN: means and stds are over the values present, as in TRL
            "reward": nan_mean(total),
            "reward_std": nan_std(total),
            **{f"rewards/{name}": nan_mean(v) for name, v in components.items()},
            **{f"reward_metrics/{name}": sum(v) / len(v) for name, v in inputs.logged_metrics.items() if v},
            **{k: float(v) for k, v in adv_metrics.items() if k not in ("reward_mean", "reward_std")},
            "completion_length": mask.sum(1).float().mean().item(),
            "grad_norm": float(grad_norm),
            "skipped_updates": skipped,
            **{f"reward_errors/{r.name}": reward_errors.get(r.name, 0) for r in self.rewards if cfg.data.on_reward_error == "zero"},
            **{f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups},
            "perf/vision_calls": self.vision_counter.calls,
            "perf/vision_images": self.vision_counter.images,
            "perf/prefill_tokens": ro.stats["prefill_tokens"],
            "perf/decode_tokens": ro.stats["decode_tokens"],
        }
        metrics = self._mean_over_processes(metrics)
        metrics.update(step=step + 1, step_time=time.perf_counter() - started)
        self._log_completions(step + 1, ro, total, components, advantages, indices, inputs.extra_columns)
        return metrics

    def _log_completions(self, step, ro: Rollout, total, components, advantages, indices, extra=None) -> None:
        if not self.cfg.logging.log_completions:
            return
        g = self.cfg.data.num_generations
        # columns rewards logged with log_extra, one value per completion (others cannot be lined up)
        extra = {k: v for k, v in (extra or {}).items() if len(v) == len(ro.completions)}
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
                    **({"extra": {k: _loggable(v[i]) for k, v in extra.items()}} if extra else {}),
                }
            )
        gathered = self._gather_rows(rows)
        self.log.completions(gathered)

    def _gather_rows(self, rows: list[dict]) -> list[dict]:
        if self.accelerator.num_processes == 1:
            return rows
        from accelerate.utils import gather_object

        return gather_object(rows)



