"""The attributes and methods of TRL's trainers that scripts and tests touch, on this project's trainers.

TRL's trainer holds plain attributes that scripts replace (a stub accelerator, a mocked model): `settable` gives ours
the same freedom (once set, the instance's own value is read back; the run keeps its own parts). The rest reads the
run's parts: `_metrics` (the numbers logged since the last log), the data loaders a script may iterate, and GRPO's
own (`ref_model`, `entropy_coef`, `aux_loss_enabled`, `_logs`, the entropy and off-policy masks, `_generate` with a
rollout_func).
"""

from __future__ import annotations

from typing import Any

import torch


class settable:
    """A read-through attribute that an assignment replaces for this instance (TRL's attributes are plain)."""

    def __init__(self, fget):
        self.fget, self.__doc__, self.name = fget, fget.__doc__, fget.__name__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        return self.fget(obj)

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.name] = value


def _identity(batch: list) -> list:
    return batch


class TrainerSurface:
    """What every trainer (GRPO, SFT) shows a TRL script beyond the run's own parts."""

    @settable
    def _metrics(self) -> dict[str, dict[str, list]]:
        """TRL's per-mode lists of the numbers logged since the last log ("train": this run's steps since then)."""
        pending: dict[str, list] = {}
        for entry in self.callback_bridge.pending:
            for key, value in entry.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    pending.setdefault(key, []).append(value)
        return {"train": pending, "eval": {}}

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """The training rows in the run's order, one batch per generation (each prompt num_generations times in a
        row, as TRL's sampler yields them), with args.dataloader_num_workers workers (0 for a stream)."""
        cfg = self.cfg
        g = getattr(cfg.data, "num_generations", 1) if self.stage == "grpo" else 1
        order = [i for step in range(cfg.max_steps // getattr(cfg, "steps_per_generation", 1) or 1)
                 for i in self.data.batch(step).rows for _ in range(g)]
        return torch.utils.data.DataLoader(_Rows(self.data.dataset, order), batch_size=cfg.data.batch_size * g,
                                           num_workers=self._workers(getattr(self, "train_dataset_given", None)), collate_fn=_identity)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> torch.utils.data.DataLoader:
        """The held-out rows (`eval_dataset`, else the run's), eval.eval_batch_size prompts a batch; a stream is read
        by one worker (the override is this loader's alone: args keep their value)."""
        given = eval_dataset if eval_dataset is not None else getattr(self, "eval_dataset", None)
        rows = self.evaluation.heldout_data
        return torch.utils.data.DataLoader(_Rows(rows, list(range(len(rows)))), batch_size=self.cfg.eval.eval_batch_size,
                                           num_workers=self._workers(given), collate_fn=_identity)

    def _workers(self, data: Any) -> int:
        from datasets import IterableDataset

        return 0 if isinstance(data, IterableDataset) else int(getattr(self.args, "dataloader_num_workers", 0) or 0)


class _Rows(torch.utils.data.Dataset):
    def __init__(self, source, order: list[int]):
        self.source, self.order = source, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: int):
        return self.source[self.order[k]]


class GRPOSurface:
    """GRPO's own attributes and methods of TRL's GRPOTrainer."""

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
