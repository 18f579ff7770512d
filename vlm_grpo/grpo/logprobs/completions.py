"""Per-token log-probabilities of completions.

The training path (`group_scores`) never builds logits: the LM head scores the tokens chunk by chunk from the
hidden states (lm_head.py), with each prompt's images encoded once for its rows.

`token_logprobs` scores tokens under logits someone already has (generate()'s, a probe's): it works through
them in chunks (each cast to fp32 and reduced to log p(token) and optionally the entropy), so no fp32 copy of
all of [rows, T, vocab] exists at once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch

from vlm_grpo.adapters.completion_images import CompletionImages, with_turn_images
from vlm_grpo.adapters.sharing import embed_with_features, image_features, text_side
from vlm_grpo.adapters.teacher_forcing import completion_logits
from vlm_grpo.grpo.logprobs.lm_head import CHUNK_BYTES, TokenScores, logit_scores, score_completions
from vlm_grpo.grpo.logprobs.prompt_cache import differentiable_prompt_cache, shared_prompt_scores


def _blocks(rows: int, steps: int, vocab: int, chunk_bytes: int):
    """(row slice, step slice) blocks whose fp32 copy stays under `chunk_bytes`."""
    per_token = max(1, vocab * 4)
    tokens = max(1, chunk_bytes // per_token)
    if tokens >= steps:
        per_rows = max(1, tokens // max(1, steps))
        for r in range(0, rows, per_rows):
            yield slice(r, min(rows, r + per_rows)), slice(0, steps)
    else:
        for r in range(rows):
            for t in range(0, steps, tokens):
                yield slice(r, r + 1), slice(t, min(steps, t + tokens))


def token_logprobs_and_entropy(
    logits: torch.Tensor, token_ids: torch.Tensor, with_entropy: bool = True, chunk_bytes: int = CHUNK_BYTES,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(token), entropy) per position, both fp32 [B, T]; only the log-probs carry a gradient.

    `temperature`: the distribution the tokens were sampled from is softmax(logits / temperature); GRPO's
    ratio, KL and entropy are taken under that same distribution (as TRL does). Dividing inside the chunk loop
    keeps a scaled fp32 copy of all the logits from ever existing."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows, steps, vocab = logits.shape
    logps = logits.new_empty(rows, steps, dtype=torch.float32)
    entropy = torch.zeros(rows, steps, dtype=torch.float32, device=logits.device)
    for rs, ts in _blocks(rows, steps, vocab, chunk_bytes):  # each block reduced as the LM-head path reduces a chunk
        logps[rs, ts], entropy[rs, ts], _ = logit_scores(logits[rs, ts], token_ids[rs, ts], temperature, with_entropy,
                                                         with_hits=False)
    return logps, entropy


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """log p(token) under `logits`, computed in fp32 chunks: [B, T]."""
    return token_logprobs_and_entropy(logits, token_ids, with_entropy=False, chunk_bytes=chunk_bytes)[0]


def completion_logprobs(adapter, batch, completion_ids, completion_mask, model=None) -> torch.Tensor:
    logits = completion_logits(adapter, batch, completion_ids, completion_mask, model=model)
    return token_logprobs(logits, completion_ids)


@dataclass
class ScoreOptions:
    """How `group_scores` computes. share_features: each distinct prompt's images are encoded once
    (`sharing.image_features` on the distinct prompts, with gradient when the encoder trains) and placed into all its
    rows; `features` (an ImageFeatures of all of the prompts, e.g. the rollout's, detached) skips the encoder.
    Otherwise every row's prompt is repeated, pixels included, and the model encodes each copy. share_prompt (with
    share_features): each distinct prompt runs once and its KV cache serves its rows (prompt_cache.py), where
    gradients can pass the cache (`differentiable_prompt_cache`). `turns`: the images tool turns showed inside these
    rows' completions (multi-turn rollouts), placed after the prompt's in each row; `turn_features` (of
    `turns.turns`, e.g. the rollout's) skips encoding them. `context`: entered around the feature and embedding
    computation (e.g. the accelerator's autocast). router_aux: also a mixture-of-experts model's router
    load-balancing loss (`TokenScores.aux_loss`); it is taken over each row's whole sequence in one forward, as the
    model defines it, so the prompt is not shared then. padding_free (with share_prompt): the completions that follow
    the prompt's cache run packed end to end where packing.py's rule says so. The rest go to the LM head
    (lm_head.chunked_scores):
    GRPO reads no argmax hits, hence with_hits off."""

    share_features: bool = True
    share_prompt: bool = False
    features: Any = None
    turns: CompletionImages | None = None
    turn_features: Any = None
    context: Callable[[], Any] | None = None
    router_aux: bool = False
    temperature: float = 1.0
    with_entropy: bool = False
    entropy_grad: bool = False
    with_hits: bool = False
    chunk_bytes: int = CHUNK_BYTES
    padding_free: str = "off"  # with share_prompt: the completions packed end to end (packing.py): on, auto, off

    def head(self) -> dict[str, Any]:
        """The LM head's options."""
        return {"temperature": self.temperature, "with_entropy": self.with_entropy, "entropy_grad": self.entropy_grad,
                "with_hits": self.with_hits, "chunk_bytes": self.chunk_bytes}


def group_scores(adapter, prompts, prompt_index: list[int], completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                 model=None, options: ScoreOptions | None = None) -> TokenScores:
    """TokenScores for rows `k` = (prompt `prompt_index[k]` of `prompts`, completion k), logits never built, as
    `options` say (ScoreOptions)."""
    o = options or ScoreOptions()
    share_features, share_prompt, features, turns, turn_features, context, router_aux = (
        o.share_features, o.share_prompt, o.features, o.turns, o.turn_features, o.context, o.router_aux)
    options = o.head()

    model = adapter.model if model is None else model
    types = None if turns is None else turns.token_types
    # faster paths only where the adapter proved them for this model
    share_prompt = share_prompt and adapter.shares_prefix and not router_aux and differentiable_prompt_cache(model)
    if not share_features or not adapter.shares_features:
        rows = with_turn_images(adapter, prompts.select(prompt_index), turns)
        inputs = adapter.completion_inputs(rows, completion_ids, completion_mask, types)
        return score_completions(adapter, rows, completion_ids, completion_mask, model=model, inputs=inputs,
                                 router_aux=router_aux, **options)
    distinct = sorted(set(prompt_index))
    where = {p: k for k, p in enumerate(distinct)}
    with context() if context is not None else contextlib.nullcontext():
        encoded = image_features(adapter, prompts.select(distinct), model=model) if features is None \
            else features.select(distinct)
        if turns is not None and turn_features is None:
            turn_features = image_features(adapter, turns.turns, model=model)
        if share_prompt:
            return shared_prompt_scores(adapter, prompts, prompt_index, encoded, completion_ids, completion_mask, model,
                                        turns=turns, turn_features=turn_features, padding_free=o.padding_free,
                                        **options)
        row_features = encoded.select([where[p] for p in prompt_index])
        if turns is not None:
            row_features = turns.row_features(row_features, turn_features)
        text = with_turn_images(adapter, text_side(adapter, prompts).select(prompt_index), turns, pixels=False)
        inputs = embed_with_features(adapter, text, row_features, completion_ids, completion_mask, model=model,
                                     completion_types=types)
    return score_completions(adapter, text, completion_ids, completion_mask, model=model, inputs=inputs,
                             router_aux=router_aux, **options)
