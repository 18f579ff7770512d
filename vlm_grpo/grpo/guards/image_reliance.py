"""Image reliance: how much the policy's sampled answers depend on the image they were asked about.

On a few of the step's prompts (the first `samples` with images), the completions already sampled are scored
three times by the policy (no gradient, the trainer's own log-prob path): with their image, with a blank image
(the same size, one colour: the image's mean) and with another prompt's image (resized to this one's size). The
reliance is the mean per-token log-prob with the image minus without it, in nats per token: about 0 when the
answers would be the same for any picture (the policy answers from the text prior), above 0 when they need the
image. Beside it, the attention-to-image share of the heatmaps (adapters/image_attention.py), averaged over the
answer tokens of one completion per prompt.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Callable

import torch
from PIL import Image, ImageStat

from vlm_grpo.adapters.image_attention import image_attention_share
from vlm_grpo.grpo.algorithm.trajectory import Trajectory
from vlm_grpo.grpo.rollout.generation import encode
from vlm_grpo.recipes.base import Sample

log = logging.getLogger(__name__)
PREFIX = "grounding/"


def blank_image(image: Image.Image) -> Image.Image:
    """The image's size, filled with its mean colour: the same tokens, no content."""
    rgb = image.convert("RGB")
    return Image.new("RGB", rgb.size, tuple(int(round(c)) for c in ImageStat.Stat(rgb).mean))


def blanked(samples: list[Sample]) -> list[Sample]:
    return [replace(s, images=[blank_image(i) for i in s.images]) for s in samples]


def swapped(samples: list[Sample]) -> list[Sample] | None:
    """Each sample with the next one's images, resized to its own (None: fewer than two, or image counts differ)."""
    if len(samples) < 2 or len({len(s.images) for s in samples}) > 1:
        return None
    out = []
    for k, sample in enumerate(samples):
        donor = samples[(k + 1) % len(samples)]
        out.append(replace(sample, images=[d.convert("RGB").resize(i.size) for d, i in zip(donor.images, sample.images)]))
    return out


def subset(traj: Trajectory, prompts: list[int]) -> Trajectory:
    """The trajectory of `prompts` alone (all their completions), with nothing cached for the old prompts."""
    g = traj.num_generations
    rows = [p * g + j for p in prompts for j in range(g)]
    return replace(
        traj, prompts=traj.prompts.select(prompts), sample_indices=[traj.sample_indices[p] for p in prompts],
        prompt_texts=[traj.prompt_texts[p] for p in prompts], completions=[traj.completions[r] for r in rows],
        completion_ids=traj.completion_ids[rows], completion_mask=traj.completion_mask[rows],
        loss_mask=traj.loss_mask[rows], rewards=traj.rewards[rows],
        reward_components={k: v[rows] for k, v in traj.reward_components.items()},
        advantages=traj.advantages[rows], old_logps=None, ref_logps=None, features=None, policy_features=None,
        extra={}, stats={},
    )


def token_mean(logps: torch.Tensor, mask: torch.Tensor) -> float:
    mask = mask.to(logps.dtype)
    return float((logps * mask).sum() / mask.sum().clamp(min=1))


class ImageReliance:
    """`score(traj, rows) -> [rows, T] log-probs` is the trainer's log-prob path; `attention`: also measure the
    attention share (an unsharded model: the eager forward runs on `adapter.model` itself)."""

    def __init__(self, adapter, device, score: Callable, attention: bool = True):
        self.adapter, self.device, self.score, self.attention = adapter, device, score, attention
        self.told: set[str] = set()
        self.rows: list[int] = []  # the last measurement's completions: the first of each prompt measured

    def _once(self, key: str, message: str) -> None:
        if key not in self.told:
            self.told.add(key)
            log.warning(message)

    def _variant(self, sub: Trajectory, samples: list[Sample] | None) -> float:
        """Mean token log-prob of the completions under `samples`' prompts (NaN: they tokenize otherwise)."""
        if samples is None:
            return math.nan
        prompts = encode(self.adapter, samples, self.device)
        if not torch.equal(prompts.input_ids, sub.prompts.input_ids):
            self._once("tokens", "image reliance: a replaced image changed the prompt's tokens; not measured")
            return math.nan
        other = replace(sub, prompts=prompts, features=None)  # never the own images' features, cached by a score
        return token_mean(self.score(other, list(range(len(other)))), other.completion_mask)

    def measure(self, samples: list[Sample], traj: Trajectory, count: int) -> dict[str, float]:
        """The metrics (`grounding/...`) on the first `count` prompts that have images; NaN what cannot be measured
        (every process logs the same keys: they are averaged over processes)."""
        keys = ("logprob_with_image", "image_reliance", "image_reliance_swap", "attention_to_image")
        nothing = {f"{PREFIX}{k}": math.nan for k in keys}
        chosen = [k for k, s in enumerate(samples) if s.images][:count]
        self.rows = []
        if not chosen:
            return nothing
        picked = [samples[k] for k in chosen]
        self.rows = [k * traj.num_generations for k in chosen]
        sub = subset(traj, chosen)
        with torch.no_grad():
            own = token_mean(self.score(sub, list(range(len(sub)))), sub.completion_mask)
            blank, other = self._variant(sub, blanked(picked)), self._variant(sub, swapped(picked))
            metrics = {**nothing, f"{PREFIX}logprob_with_image": own, f"{PREFIX}image_reliance": own - blank,
                       f"{PREFIX}image_reliance_swap": own - other}
            if self.attention:
                first = [k * traj.num_generations for k in range(len(chosen))]  # one completion per prompt
                try:
                    metrics[f"{PREFIX}attention_to_image"] = image_attention_share(
                        self.adapter, sub.prompts, sub.completion_ids[first], sub.completion_mask[first])
                except (RuntimeError, ValueError, TypeError) as err:  # a model that returns no attention weights
                    self._once("attention", f"attention to the image not measured: {err}")
        return metrics
