"""What a GRPO step reports: its reward and cost metrics, and its completions (completions.jsonl, parquet and the
trackers' tables; with log_multimodal, each prompt's images and video frames saved and referenced from its rows)."""

from __future__ import annotations

from typing import Any, Callable

from vlm_grpo.grpo.algorithm.trajectory import Trajectory
from vlm_grpo.grpo.rewards.scoring import nan_mean, nan_std
from vlm_grpo.grpo.run.completion_files import completion_rows, prompt_media, save_step


class StepLog:
    def __init__(self, ctx, rewards: list, policy, vision_counter, flags: Callable[[int], dict[str, Any]]):
        """`flags(row)`: what the guards say of a completion (grpo/training/hacking_watch.py)."""
        self.ctx, self.cfg, self.rewards, self.policy = ctx, ctx.cfg, rewards, policy
        self.vision_counter, self.flags = vision_counter, flags

    def reward_metrics(self, scored) -> dict[str, float]:
        traj, errors = scored.trajectory, scored.reward_errors
        return {
            # a reward's None (not applicable) is NaN: means and stds are over the values present, as in TRL
            "reward": nan_mean(traj.rewards),
            "reward_std": nan_std(traj.rewards),
            **{f"rewards/{name}": nan_mean(v) for name, v in traj.reward_components.items()},
            **{f"reward_metrics/{name}": sum(v) / len(v) for name, v in scored.logged.items() if v},
            **{k: float(v) for k, v in scored.advantage_metrics.items() if k not in ("reward_mean", "reward_std")},
            "completion_length": traj.model_tokens().sum(1).float().mean().item(),  # the model's own tokens
            **{f"tools/{k}": v for k, v in traj.tool_metrics.items()},
            **{f"reward_errors/{r.name}": errors.get(r.name, 0) for r in self.rewards
               if self.cfg.data.on_reward_error == "zero"},
        }

    def cost_metrics(self, traj: Trajectory) -> dict[str, float]:
        return {
            **self.policy.learning_rates(),
            "perf/vision_calls": self.vision_counter.calls,
            "perf/vision_images": self.vision_counter.images,
            "perf/prefill_tokens": traj.stats["prefill_tokens"],
            "perf/decode_tokens": traj.stats["decode_tokens"],
        }

    def completions(self, step: int, traj: Trajectory, samples: list) -> None:
        if not self.cfg.logging.log_completions:
            return
        ctx = self.ctx
        process = ctx.accelerator.process_index
        rows = ctx.gather_rows(completion_rows(traj, step, process, self.flags))
        media = None
        if self.cfg.logging.log_multimodal:  # the pictures travel to the main process, which saves them
            media = ctx.gather_rows([{"process": process, "group": k, **prompt_media(s)} for k, s in enumerate(samples)])
        if ctx.is_main:
            rows = save_step(ctx.run_dir, step, rows, media)
        ctx.log.completions(rows)
        ctx.trackers.completions(rows, step)
