"""Training forwards that run each prompt once: its keys and values are reused by all of its completions.

A GRPO step scores G completions of each prompt, and the prompt (image tokens included) is most of each row.
Here the distinct prompts go through the model once with the KV cache on; the cache is indexed out to one
row per completion and the completions alone run on top of it. Every operation on the way is differentiable
(the cache's tensors are the prefix pass's activations), so gradients reach the prompt positions, the image
features and a trainable vision tower exactly as in one full forward per row. Positions come from the full
rows (the adapter's hooks: 3-D rotary positions, mask-based ones, whatever a family uses), so both passes see the
positions the plain forward would.

Completion token 0 is predicted by the prompt's last position (the prefix pass keeps its logits: one row of the
vocabulary per distinct prompt); tokens 1.. by the completion pass, scored chunk by chunk (head_logprobs.py).
"""

from __future__ import annotations

import torch

from vlm_grpo.adapters.features import ImageFeatures, hf_core
from vlm_grpo.adapters.sharing import embed_with_features, text_side
from vlm_grpo.grpo.logprobs.lm_head import TokenScores, logit_scores, scoring_head


def _full_positions(adapter, full: dict[str, torch.Tensor], core) -> torch.Tensor:
    """The positions one plain forward over prompt + completion would use ([R, L+T], or [3, R, L+T] for M-RoPE)."""
    positions = adapter.shared_position_ids(full, core)
    if positions is None:
        positions = full.get("position_ids")
    if positions is None:  # the model counts positions itself: 0, 1, 2 ... over the padded row
        ids = full["input_ids"]
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
    return positions


def shared_prompt_scores(adapter, prompts, prompt_index: list[int], features: ImageFeatures,
                         completion_ids: torch.Tensor, completion_mask: torch.Tensor, model: torch.nn.Module, *,
                         temperature: float = 1.0, with_entropy: bool = False, with_hits: bool = True,
                         **options) -> TokenScores:
    """TokenScores of rows `k` = (prompt `prompt_index[k]`, completion k); `features`: the image features of the
    distinct prompts in sorted order (`sorted(set(prompt_index))`)."""
    core = hf_core(model)
    distinct = sorted(set(prompt_index))
    where = {p: k for k, p in enumerate(distinct)}
    rows = [where[p] for p in prompt_index]
    text = text_side(adapter, prompts)
    full = adapter.completion_inputs(text.select(prompt_index), completion_ids, completion_mask)
    length, steps = prompts.input_ids.shape[1], completion_ids.shape[1]
    positions = _full_positions(adapter, full, core)
    first_rows = torch.tensor([prompt_index.index(p) for p in distinct], device=positions.device)

    empty = completion_ids[:, :0]
    prefix = embed_with_features(adapter, text.select(distinct), features, empty[: len(distinct)],
                                 empty[: len(distinct)], model=model)
    prefix["position_ids"] = positions.index_select(-2, first_rows)[..., :length]
    # The prefix runs through the unwrapped model (as the image encoder does), so a DDP wrapper sees one forward
    # per backward: the completion pass below.
    out = core(**prefix, use_cache=True, logits_to_keep=1)
    first = logit_scores(out.logits[:, -1][rows], completion_ids[:, 0], temperature, with_entropy, with_hits)
    if steps == 1:
        return TokenScores(*(t.unsqueeze(1) for t in first))

    cache = out.past_key_values
    cache.batch_select_indices(torch.tensor(rows, device=completion_ids.device))  # one cache row per completion
    with scoring_head(model, completion_ids[:, 1:], temperature=temperature, with_entropy=with_entropy,
                      with_hits=with_hits, **options) as scorer:
        model(input_ids=completion_ids, attention_mask=full["attention_mask"], position_ids=positions[..., length:],
              past_key_values=cache, use_cache=True, logits_to_keep=steps)
    return TokenScores(*(torch.cat([a.unsqueeze(1), b], dim=1) for a, b in zip(first, scorer.scores)))
