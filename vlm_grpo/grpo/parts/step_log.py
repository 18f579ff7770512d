"""What a GRPO step reports: its reward and cost metrics, and its completions (completions.jsonl, parquet and the
trackers' tables; with log_multimodal, each prompt's images and video frames saved and referenced from its rows)."""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any, Callable

import torch

from vlm_grpo.grpo.algorithm.trajectory import Trajectory
from vlm_grpo.grpo.rewards.weighted import nan_mean, nan_std
from vlm_grpo.grpo.run.completion_files import completion_rows, prompt_media, save_step


class StepLog:
    def __init__(self, ctx, rewards: list, policy, vision_counter, flags: Callable[[int], dict[str, Any]]):
        """`flags(row)`: what the guards say of a completion (grpo/guards/hacking_watch.py)."""
        self.ctx, self.cfg, self.rewards, self.policy = ctx, ctx.cfg, rewards, policy
        self.vision_counter, self.flags = vision_counter, flags
        self.eos_ids = list(policy.adapter.eos_token_ids)
        self.tokens_seen = 0  # TRL's num_tokens: prompt and completion tokens of every step so far
        # TRL's trainer._logs: the last generation's prompts, completions, rewards, advantages, logged extra columns
        # and (with logging.log_multimodal) images, as its scripts and tests read them
        self.trl_logs: dict[str, Any] = {"images": deque(), "prompt": deque(), "completion": deque(),
                                         "rewards": defaultdict(deque), "advantages": deque(),
                                         "extra": defaultdict(deque)}

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

    # the tokens seen so far travel in checkpoints: a resumed run counts on from them
    def state_dict(self) -> dict[str, Any]:
        return {"tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens_seen = int(state.get("tokens_seen", 0))

    def keep_trl_logs(self, traj: Trajectory, samples: list) -> None:
        """The step's rows into TRL's `_logs` buffers (each keeps one generation's rows)."""
        n, g = len(traj.completions), traj.num_generations
        logs = self.trl_logs
        for key in ("images", "prompt", "completion", "advantages"):
            logs[key] = deque(maxlen=n)
        logs["rewards"] = defaultdict(lambda: deque(maxlen=n))
        logs["extra"] = defaultdict(lambda: deque(maxlen=n))
        logs["prompt"].extend(traj.prompt_texts[i // g] for i in range(n))
        logs["completion"].extend(traj.completions)
        for name, values in traj.reward_components.items():
            logs["rewards"][name].extend(values.tolist())
        advantages = traj.advantages if traj.advantages.dim() == 1 else traj.advantages[:, 0]
        logs["advantages"].extend(advantages.tolist())
        for column, values in traj.extra.items():
            logs["extra"][column].extend(values)
        if self.cfg.logging.log_multimodal:
            logs["images"].extend(list(getattr(samples[i // g], "images", None) or []) for i in range(n))

    def trl_metrics(self, traj: Trajectory, rates: dict[str, float], logged: dict[str, list]) -> dict[str, float]:
        """TRL's step keys beside ours: the learning rate the update used, each reward's mean and std, the tokens
        seen so far (prompt and completion, every completion counting its prompt) and completion-length stats
        (terminated: ended by an end-of-sequence token before the limit; clipped: the rest)."""
        mask = traj.completion_mask
        lengths = mask.sum(1).float()
        ended = lengths < mask.shape[1]
        last = traj.completion_ids.gather(1, (lengths.long() - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ended |= torch.isin(last, torch.tensor(self.eos_ids, device=last.device)) & (lengths > 0)
        self.tokens_seen += int(traj.prompts.attention_mask.sum()) * traj.num_generations + int(mask.sum())
        terminated = lengths[ended] if bool(ended.any()) else lengths.new_zeros(1)
        return {
            "learning_rate": self.learning_rate(rates),
            **{f"rewards/{name}/mean": nan_mean(v) for name, v in traj.reward_components.items()},
            **{f"rewards/{name}/std": nan_std(v) for name, v in traj.reward_components.items()},
            "num_tokens": float(self.tokens_seen),
            "completions/mean_length": lengths.mean().item(),
            "completions/min_length": lengths.min().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": 1.0 - ended.float().mean().item(),
            "completions/mean_terminated_length": terminated.mean().item(),
            "completions/min_terminated_length": terminated.min().item(),
            "completions/max_terminated_length": terminated.max().item(),
            **{name: sum(v) / len(v) for name, v in logged.items() if v},  # a reward's log_metric, TRL's key
        }

    @staticmethod
    def learning_rate(rates: dict[str, float]) -> float:
        """TRL's single learning_rate: the language model's group (else the first group's)."""
        return rates.get("lr/language", next(iter(rates.values()), 0.0))

    def cost_metrics(self, traj: Trajectory, rates: dict[str, float]) -> dict[str, float]:
        """`rates`: the learning rates the step's update used (read before the schedule moved on)."""
        return {
            **rates,
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
