"""Prompt groups taken from several single-turn rollouts, joined into one (dynamic sampling's refilled batch):
each group's G completions in the order given, padded to the widest, the prompts encoded again as one batch."""

from __future__ import annotations

import torch

from vlm_grpo.grpo.rollout.generation import Rollout, encode


def join_groups(adapter, device, picks: list[tuple[Rollout, int]], samples: list, cache=None,
                stats: dict[str, int] | None = None) -> Rollout:
    """`picks`: (rollout, group) pairs, one per prompt of the result; `samples`: those prompts' samples, in that
    order; `stats`: the rollout cost to report (default: the picked rollouts' summed)."""
    if not picks:
        raise ValueError("no prompt group to join")
    g = picks[0][0].num_generations
    for ro, _ in picks:
        if ro.tool_mask is not None or ro.completion_images is not None or ro.extra_fields:
            raise ValueError("tool rollouts and a rollout_func's columns cannot be joined across rollout batches")
    width = max(ro.completion_ids.shape[1] for ro, _ in picks)

    def rows(ro: Rollout, k: int) -> slice:
        return slice(k * g, (k + 1) * g)

    def padded(x: torch.Tensor, fill) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=fill)

    ids = torch.cat([padded(ro.completion_ids[rows(ro, k)], adapter.pad_token_id) for ro, k in picks])
    mask = torch.cat([padded(ro.completion_mask[rows(ro, k)], 0) for ro, k in picks])
    sampling = None
    if all(ro.sampling_logps is not None for ro, _ in picks):
        sampling = torch.cat([padded(ro.sampling_logps[rows(ro, k)], float("nan")) for ro, k in picks])
    if stats is None:
        stats = {}
        for ro in {id(ro): ro for ro, _ in picks}.values():
            for key, value in ro.stats.items():
                stats[key] = stats.get(key, 0) + value
    prompts = encode(adapter, samples, device, cache=cache)
    return Rollout(
        prompts=prompts, completion_ids=ids, completion_mask=mask,
        truncated=torch.cat([ro.truncated[rows(ro, k)] for ro, k in picks]),
        completions=[text for ro, k in picks for text in ro.completions[rows(ro, k)]],
        prompt_texts=[ro.prompt_texts[k] for ro, k in picks], num_generations=g, stats=stats,
        sampling_logps=sampling)
