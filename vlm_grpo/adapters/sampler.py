"""The next token drawn by inverse CDF: the distribution generate()'s sampling draws from, at a fraction of its cost.

generate() samples with `torch.multinomial(softmax(scores))`, which on one draw runs an exponential race: one
exponential random number per vocabulary entry and row. At a 151,936-id vocabulary that costs more per decode step
than a small model's whole forward (benchmarks/RESULTS.md). The same draw needs a uniform per row placed on the
cumulative sum of the unnormalized probabilities, `exp(scores - max)` as softmax computes them: here in two levels
(a block of ~sqrt(V) ids by the blocks' float32 sums, then an id by the block's float64 cumulative sum), so each
token's interval is its probability to float32 precision, as softmax's own values are.

`InverseCdfSampler` is a logits processor for a *greedy* generate(): it applies everything generate() applies when
sampling (the suppressed ids and min_new_tokens' EOS mask, then HF's own warpers in HF's order: temperature, top-h,
top-k, top-p, min-p, typical, epsilon, eta), draws, and returns scores that are -inf everywhere except at the drawn
token, so generate()'s argmax takes it. Suppression and the EOS mask touch only their own ids, instead of a
vocabulary-wide mask built at every step, and the draw works in place on the scores generate() copied for it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

SAMPLERS = ("inverse_cdf", "multinomial")  # the same distribution; multinomial is generate()'s own draw


def inverse_cdf_draw(scores: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """One token per row of `scores` [N, V], drawn from softmax(scores) (-inf: never drawn): [N] long.
    `in_place`: `scores` may be overwritten (with the unnormalized probabilities).

    Two levels, each an inverse-CDF draw: a block of ~sqrt(V) ids by the block sums, then an id inside the block by
    its float64 cumulative sum. The same distribution as one cumulative sum over all V ids, in float32 passes over
    the vocabulary (a float64 copy of it costs more than the draw); the block sums are float32, as precise as
    softmax's own float32 probabilities."""
    rows, vocab = scores.shape
    top = scores.amax(dim=-1, keepdim=True)
    if not bool(torch.isfinite(top).all()):
        row = int((~torch.isfinite(top)).nonzero()[0, 0])
        raise ValueError(f"sampling: row {row} has no token left to draw (every score is -inf or not finite after "
                         "suppression, min_new_tokens and top-k/top-p)")
    weights = scores.sub_(top).exp_() if in_place else torch.exp(scores - top)  # softmax's numerators
    size = max(1, math.isqrt(vocab))
    full = vocab // size
    sums = weights[:, : full * size].view(rows, full, size).sum(-1)
    if full * size < vocab:  # a shorter last block
        sums = torch.cat([sums, weights[:, full * size :].sum(-1, keepdim=True)], dim=-1)
    block = _draw(sums.double())
    columns = block.unsqueeze(-1) * size + torch.arange(size, device=scores.device)
    inside = weights.gather(-1, columns.clamp(max=vocab - 1)).double() * (columns < vocab)
    return block * size + _draw(inside)


def _draw(weights: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one column per row, proportional to `weights` [N, K] (float64, >= 0, each row > 0)."""
    cdf = torch.cumsum(weights, dim=-1)
    total = cdf[:, -1:]
    target = torch.rand(total.shape, dtype=torch.float64, device=weights.device) * total
    # u * total can round up to total; below it, the first entry past `target` always has a positive weight
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def hf_warpers(generation_config, temperature: float | None, top_k: int | None, top_p: float | None,
               min_tokens_to_keep: int = 1) -> list[LogitsProcessor]:
    """The warpers generate() appends when it samples, in its order, for these settings and the model's generation
    config (min-p, typical, epsilon, eta and top-h come from the config)."""
    get = lambda name: getattr(generation_config, name, None)  # noqa: E731
    warpers: list[LogitsProcessor] = []
    if temperature is not None and temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if get("top_h") is not None:
        warpers.append(TopHLogitsWarper(top_h=get("top_h")))
    if top_k is not None and top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=min_tokens_to_keep))
    if top_p is not None and top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=min_tokens_to_keep))
    if get("min_p") is not None:
        warpers.append(MinPLogitsWarper(min_p=get("min_p"), min_tokens_to_keep=min_tokens_to_keep))
    if get("typical_p") is not None and get("typical_p") < 1.0:
        warpers.append(TypicalLogitsWarper(mass=get("typical_p"), min_tokens_to_keep=min_tokens_to_keep))
    if get("epsilon_cutoff") is not None and 0.0 < get("epsilon_cutoff") < 1.0:
        warpers.append(EpsilonLogitsWarper(epsilon=get("epsilon_cutoff"), min_tokens_to_keep=min_tokens_to_keep))
    if get("eta_cutoff") is not None and 0.0 < get("eta_cutoff") < 1.0:
        warpers.append(EtaLogitsWarper(epsilon=get("eta_cutoff"), min_tokens_to_keep=min_tokens_to_keep))
    return warpers


class TokenLogps:
    """Each drawn token's log-prob under the model's raw scores at `temperature` (before suppression and the
    warpers: log_softmax(logits / T) over the whole vocabulary, as the trainer's log-prob forwards take it), one
    column per decode step: [N, steps] once the generate() call is over."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.columns: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def before_draw(self, scores: torch.Tensor) -> None:
        self._pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)

    def drawn(self, tokens: torch.Tensor) -> None:
        self.columns.append(self._pending.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
        self._pending = None

    def tensor(self) -> torch.Tensor | None:
        return torch.stack(self.columns, dim=1) if self.columns else None


class InverseCdfSampler(LogitsProcessor):
    """Samples the next token inside a greedy generate() (see the module doc). One instance serves one generate()
    call: the first call it sees carries the prompt, whose length min_new_tokens counts from. `in_place`: the scores
    it is given may be overwritten (generate() keeps them only for output_logits): no vocabulary-sized tensor is
    allocated at all; otherwise it works on a copy."""

    def __init__(self, suppressed_ids: Sequence[int], eos_token_ids: Sequence[int], min_new_tokens: int = 0,
                 warpers: Sequence[LogitsProcessor] = (), in_place: bool = False, token_logps: TokenLogps | None = None):
        self.token_logps = token_logps
        self.suppressed_ids = list(suppressed_ids)
        self.eos_token_ids = list(eos_token_ids)
        self.min_new_tokens = min_new_tokens
        self.warpers = LogitsProcessorList(warpers)
        self.in_place = in_place
        self.prompt_length: int | None = None
        self._ids: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}

    def _banned(self, device, early: bool) -> torch.Tensor:
        if device not in self._ids:
            suppressed = torch.tensor(self.suppressed_ids, dtype=torch.long, device=device)
            with_eos = torch.tensor(sorted({*self.suppressed_ids, *self.eos_token_ids}), dtype=torch.long, device=device)
            self._ids[device] = (suppressed, with_eos)
        return self._ids[device][1 if early else 0]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[-1]
        early = input_ids.shape[-1] - self.prompt_length < self.min_new_tokens  # EOS not allowed yet
        banned = self._banned(scores.device, early and bool(self.eos_token_ids))
        if self.token_logps is not None:
            self.token_logps.before_draw(scores)
        if self.in_place:
            scores = scores.index_fill_(-1, banned, float("-inf")) if banned.numel() else scores
        else:
            scores = scores.index_fill(-1, banned, float("-inf")) if banned.numel() else scores.clone()
        scores = self.warpers(input_ids, scores)  # HF's warpers return new tensors: what follows owns `scores`
        tokens = inverse_cdf_draw(scores, in_place=True)
        if self.token_logps is not None:
            self.token_logps.drawn(tokens)
        return scores.fill_(float("-inf")).scatter_(-1, tokens.unsqueeze(-1), 0.0)  # generate()'s argmax takes it


def sampler_draws(sampler: str, output_logits: bool) -> bool:
    """Whether a sampling generate() draws with InverseCdfSampler: asked for, and the scores are not kept (the sampler
    overwrites them in place; generate() returns them with output_logits)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {SAMPLERS}")
    return sampler == "inverse_cdf" and not output_logits


def inverse_cdf_generation(greedy: dict[str, Any], generation_config, suppressed: list[int], eos: list[int],
                           min_new_tokens: int, token_logps: TokenLogps | None = None, **sampling: Any
                           ) -> dict[str, Any]:
    """generate() settings that sample by inverse CDF: the greedy settings `greedy` with the draw as their one logits
    processor, which applies the suppression, the EOS mask and HF's warpers (`sampling`: temperature, top_k, top_p)."""
    warpers = hf_warpers(generation_config, sampling["temperature"], sampling["top_k"], sampling["top_p"])
    draw = InverseCdfSampler(suppressed, eos, min_new_tokens, warpers, in_place=True, token_logps=token_logps)
    return {**greedy, "suppress_tokens": None, "logits_processor": LogitsProcessorList([draw])}
