"""What a run trains on: the recipe, the run's rewards (data.rewards replace the recipe's) and the training split,
every sample checked against the model the first time it is drawn, B samples a step in the run's order."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

from vlm_grpo.grpo.data.order import batch_indices, epoch_steps, repeats_note
from vlm_grpo.grpo.data.recipe_source import build_split, resolve_recipe
from vlm_grpo.grpo.heldout_eval import run_rewards_of
from vlm_grpo.grpo.training.preflight import cheap_checks, check_drawn_sample, raise_on_failure, row_names
from vlm_grpo.grpo.training.step_size import check_against_dataset
from vlm_grpo.recipes.checked import CheckedSource

PREFLIGHT_SAMPLES = 4  # samples the cheap pre-flight checks encode at the start of a run


@dataclass
class Batch:
    """A step's samples and the dataset rows they came from (messages about user code name the rows)."""

    samples: list[Any]
    rows: list[int]


class TrainingData:
    def __init__(self, ctx, recipe=None, rewards: Sequence[Any] | None = None, needs_rewards: bool = True):
        """`recipe`, `rewards`: built by the caller (the Python API) instead of from the settings."""
        cfg = self.cfg = ctx.cfg
        self.ctx = ctx
        self.recipe = recipe or resolve_recipe(cfg.data.recipe)
        # the run's rewards, loaded once: scoring, held-out evaluation, card
        self.rewards = list(rewards) if rewards is not None else run_rewards_of(
            self.recipe, cfg, ctx.device, required=needs_rewards)
        self.dataset = CheckedSource(build_split(self.recipe, cfg.data, "train", cfg.data.train_size, cfg.seed),
                                     cfg.data.on_bad_sample)
        per_step = cfg.data.batch_size * ctx.accelerator.num_processes
        check_against_dataset(len(self.dataset), cfg.data.batch_size, ctx.accelerator.num_processes)
        if cfg.epochs > 0:  # the run's length in passes over the split (TRL's num_train_epochs with max_steps -1)
            cfg.max_steps = epoch_steps(cfg.epochs, len(self.dataset), per_step) * cfg.steps_per_generation
        note = repeats_note(len(self.dataset), per_step)
        if note and ctx.is_main:
            print(note)

    def check_against(self, adapter, completion_budget: int) -> None:
        """Every sample is checked against the model the first time it is drawn (encodes, fits the positions); in
        skip mode from the start, so bad first samples are skipped rather than failing the pre-flight checks, which
        run on the first samples before any training."""
        self.dataset.for_adapter(adapter)  # a video row for a model that reads no video is a bad row
        check = functools.partial(check_drawn_sample, adapter, max_new_tokens=completion_budget)
        if self.cfg.data.on_bad_sample == "skip":
            self.dataset.check_drawn = check
        if self.ctx.is_main:
            count = min(PREFLIGHT_SAMPLES, len(self.dataset))
            first = [self.dataset[i] for i in range(count)]
            names = row_names(self.dataset, self.recipe.name, count)
            raise_on_failure(cheap_checks(adapter, first, completion_budget, names))
        self.dataset.check_drawn = check

    def batch(self, step: int) -> Batch:
        """Step `step`'s samples for this process; in skip mode a bad sample's place goes to the next good one."""
        acc, data = self.ctx.accelerator, self.cfg.data
        seed = self.cfg.seed if data.data_seed is None else data.data_seed
        idx = batch_indices(len(self.dataset), data.batch_size, step, seed, acc.process_index, acc.num_processes,
                            shuffle=data.shuffle, order=data.order)
        picked = [self.dataset.pick(i) for i in idx]
        return Batch([sample for _, sample in picked], [i for i, _ in picked])

    @property
    def skipped(self):
        return self.dataset.skipped
