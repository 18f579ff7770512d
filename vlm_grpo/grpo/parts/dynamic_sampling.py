"""DAPO's dynamic sampling (data.dynamic_sampling): a prompt whose G completions all got the same reward has no
advantage and teaches nothing, so its group is dropped and the batch refilled with the groups of further rollout
batches, drawn in the run's order, until it holds B prompts with spread or `dynamic_sampling_max_draws` further
batches have been drawn; then the rest of the batch is made of groups without spread, in order (counted). Groups
left over from the last batch drawn are not kept for later (DAPO drops them too): the data order stays a function
of the seed. The batch's groups keep their order in the data (draw by draw); the advantages are taken over the
batch as trained."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlm_grpo.grpo.parts.training_data import Batch
from vlm_grpo.grpo.parts.scoring import Rewarded
from vlm_grpo.grpo.rollout.join import join_groups


def group_spread(total: torch.Tensor, num_generations: int) -> torch.Tensor:
    """[B] bool: whether a group's rewards differ (NaN, no reward applying, counts as no value)."""
    groups = total.detach().float().reshape(-1, num_generations)
    finite = torch.isfinite(groups)
    high = torch.where(finite, groups, torch.full_like(groups, -torch.inf)).amax(dim=1)
    low = torch.where(finite, groups, torch.full_like(groups, torch.inf)).amin(dim=1)
    return (finite.sum(dim=1) >= 2) & (high > low)


@dataclass
class Filled:
    batch: Batch
    sampled: object  # the sampler's Sampled
    rewarded: Rewarded
    metrics: dict[str, float]


class DynamicSampling:
    def __init__(self, ctx, scoring, adapter, prompt_cache, agree_across_processes: bool):
        """`agree_across_processes`: every process draws as many batches as the one that needs most (their
        rollouts meet in collectives); else each decides alone (an asynchronous worker per process)."""
        self.ctx, self.cfg, self.scoring, self.adapter = ctx, ctx.cfg, scoring, adapter
        self.prompt_cache = prompt_cache
        self.agree = agree_across_processes and ctx.accelerator.num_processes > 1

    def fill(self, step: int, draws) -> Filled:
        """The step's batch: draws from `draws` (rollout_source) until B groups have spread, or the limit."""
        cfg, g, size = self.cfg, self.cfg.data.num_generations, self.cfg.data.batch_size
        taken, spread_of = [], []
        while True:
            draw = draws.next(step)
            rewarded = self.scoring.rewards_of(draw.batch.samples, draw.batch.rows, draw.sampled, step)
            taken.append((draw, rewarded))
            spread_of.append(group_spread(rewarded.total, g).tolist())
            with_spread = sum(map(sum, spread_of))
            short = with_spread < size
            if self.agree:
                short = bool(self.ctx.accelerator.reduce(torch.tensor(float(short), device=self.ctx.device),
                                                         reduction="sum") > 0)
            if not short or len(taken) > cfg.data.dynamic_sampling_max_draws:
                break
        spread = [(d, k) for d, flags in enumerate(spread_of) for k, has in enumerate(flags) if has][:size]
        flat = [(d, k) for d, flags in enumerate(spread_of) for k, has in enumerate(flags) if not has]
        picks = sorted(spread + flat[:size - len(spread)])
        groups = sum(map(len, spread_of))
        metrics = {"dynamic_sampling/draws": float(len(taken)),
                   "dynamic_sampling/spread_share": with_spread / max(groups, 1),
                   "dynamic_sampling/filled_without_spread": float(size - len(spread))}
        if picks == [(0, k) for k in range(size)]:  # the first batch as drawn
            draw, rewarded = taken[0]
            return Filled(draw.batch, draw.sampled, rewarded, metrics)
        return Filled(*self._joined(taken, picks), metrics)

    def _joined(self, taken, picks) -> tuple[Batch, object, Rewarded]:
        from vlm_grpo.grpo.parts.sampler import Sampled

        g = self.cfg.data.num_generations
        samples = [taken[d][0].batch.samples[k] for d, k in picks]
        rows = [taken[d][0].batch.rows[k] for d, k in picks]
        stats: dict[str, int] = {}
        for draw, _ in taken:  # the cost of every batch drawn, kept or not
            for key, value in draw.sampled.rollout.stats.items():
                stats[key] = stats.get(key, 0) + value
        rollout = join_groups(self.adapter, self.ctx.device, [(taken[d][0].sampled.rollout, k) for d, k in picks],
                              samples, cache=self.prompt_cache, stats=stats)
        index = [(d, i) for d, k in picks for i in range(k * g, (k + 1) * g)]

        def rows_of(per_draw: list) -> list:
            return [per_draw[d][i] for d, i in index]

        totals = [r.total for _, r in taken]
        total = torch.stack([totals[d][i] for d, i in index])
        names = taken[0][1].components
        components = {n: torch.stack([taken[d][1].components[n][i] for d, i in index]) for n in names}
        extra = {n: rows_of([r.extra.get(n, [None] * len(r.total)) for _, r in taken]) for n in taken[0][1].extra}
        errors: dict[str, int] = {}
        logged: dict[str, list[float]] = {}
        for _, r in taken:
            for n, count in r.errors.items():
                errors[n] = errors.get(n, 0) + count
            for n, values in r.logged.items():
                logged.setdefault(n, []).extend(values)
        return Batch(samples, rows), Sampled(rollout, None, None), Rewarded(total, components, errors, extra, logged)
