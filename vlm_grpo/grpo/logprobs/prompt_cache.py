"""Training forwards that run each prompt once: its keys and values are reused by all of its completions.

A GRPO step scores G completions of each prompt, and the prompt (image tokens included) is most of each row.
Here the distinct prompts go through the model once with the KV cache on; the cache is indexed out to one
row per completion and the completions alone run on top of it. Every operation on the way is differentiable
(the cache's tensors are the prefix pass's activations), so gradients reach the prompt positions, the image
features and a trainable vision tower exactly as in one full forward per row. Positions come from the full
rows (the adapter's hooks: 3-D rotary positions, mask-based ones, whatever a family uses), so both passes see the
positions the plain forward would.

Completion token 0 is predicted by the prompt's last position (the prefix pass keeps its logits: one row of the
vocabulary per distinct prompt); tokens 1.. by the completion pass, scored chunk by chunk (lm_head.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch
from vlm_grpo.adapters.cache_names import cache_argument, returned_cache
from vlm_grpo.adapters.completion_images import CompletionImages, with_turn_images
from vlm_grpo.adapters.features import ImageFeatures, hf_core
from vlm_grpo.adapters.sharing import embed_with_features, select_cache_rows, text_side
from vlm_grpo.grpo.logprobs import packing
from vlm_grpo.grpo.logprobs.lm_head import TokenScores, logit_scores, scoring_head


def differentiable_prompt_cache(model: torch.nn.Module) -> bool:
    """Whether gradients can flow through the model's KV cache. transformers updates cache layers that keep a
    recurrent or convolution state (Gated DeltaNet, short convolutions) in place, which autograd refuses: such a
    model scores one full forward per row. Read off the cache the model's own config builds (no forward)."""
    from transformers import DynamicCache

    core = hf_core(model)
    cache = DynamicCache(config=core.config.get_text_config())
    return not any(hasattr(layer, "recurrent_states") for layer in getattr(cache, "layers", ()))


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
                         turns: CompletionImages | None = None, turn_features: ImageFeatures | None = None,
                         temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                         with_hits: bool = True, padding_free: str = "off", **options) -> TokenScores:
    """TokenScores of rows `k` = (prompt `prompt_index[k]`, completion k); `features`: the image features of the
    distinct prompts in sorted order (`sorted(set(prompt_index))`). `turns` / `turn_features`: images tool turns
    showed inside the completions and their features; the completion pass places them at their tokens.
    `padding_free` (on, auto, off): the completion pass over packed rows where packing.py's rule says so."""
    core = hf_core(model)
    distinct = sorted(set(prompt_index))
    where = {p: k for k, p in enumerate(distinct)}
    rows = [where[p] for p in prompt_index]
    text = text_side(adapter, prompts)
    rows_text = with_turn_images(adapter, text.select(prompt_index), turns, pixels=False)
    full = adapter.completion_inputs(rows_text, completion_ids, completion_mask, turns and turns.token_types)
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
    first = logit_scores(out.logits[:, -1][rows], completion_ids[:, 0], temperature, with_entropy, entropy_grad,
                         with_hits)
    if steps == 1:
        return TokenScores(*(t.unsqueeze(1) for t in first))

    cache = returned_cache(out)
    head = dict(temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad, with_hits=with_hits,
                **options)
    packed = _packing(adapter, core, cache, completion_mask, rows, padding_free) if turns is None else None
    if packed is not None:
        tail = _packed_pass(model, core, cache, rows, packed, prefix["attention_mask"], completion_ids,
                            positions[..., length:], head)
        return TokenScores(*(torch.cat([a.unsqueeze(1), b], dim=1) for a, b in zip(first, tail)))
    select_cache_rows(cache, torch.tensor(rows, device=completion_ids.device))  # one cache row per completion
    inputs = {"input_ids": completion_ids, "attention_mask": full["attention_mask"]}
    if turns is not None:  # the tool turns' images go to their tokens, as the prefix pass placed the prompt's
        inputs = _with_turn_features(adapter, inputs, full, turns.completion_only(turn_features), core)
    # the head scores the completions' own tokens only, not the padding after their ends
    with scoring_head(model, completion_ids[:, 1:], keep=completion_mask[:, 1:].bool(), **head) as scorer:
        model(**inputs, position_ids=positions[..., length:], **cache_argument(core.forward, cache), use_cache=True,
              logits_to_keep=steps)
    return TokenScores(*(torch.cat([a.unsqueeze(1), b], dim=1) for a, b in zip(first, scorer.scores)))


def _attention(core) -> str | None:
    """The language model's attention implementation (the vision tower's may differ)."""
    return getattr(core.config.get_text_config(), "_attn_implementation", None) or core.config._attn_implementation


def _packing(adapter, core, cache, completion_mask: torch.Tensor, rows: list[int],
             mode: str) -> packing.PackedRows | None:
    """The packed rows of the completion pass, or None to run it padded: packed when the family proved it
    (`packs_completions`), the attention takes a 4-D mask as given (SDPA, eager), every cache layer keeps the whole
    prompt (a sliding window's would not), each completion is one run of tokens, and packing.pays says so."""
    if mode == "off" or not adapter.packs_completions or _attention(core) not in ("sdpa", "eager") \
            or any(cache.is_sliding) or any(cache.is_linear) or not packing.is_right_padded(completion_mask):
        return None
    lengths = packing.fed_lengths(completion_mask)
    packed = packing.plan(lengths, rows, completion_mask.device)
    return packed if packing.pays(len(packed.cache_rows), lengths, mode) else None


def _packed_pass(model, core, cache, rows: list[int], packed: packing.PackedRows, prompt_mask: torch.Tensor,
                 completion_ids: torch.Tensor, positions: torch.Tensor, head: dict) -> tuple[torch.Tensor, ...]:
    """Scores of completion tokens 1.. from one pass over the packed rows (packing.py): [rows, T - 1] each."""
    count, steps = completion_ids.shape
    select_cache_rows(cache, torch.tensor([rows[k] for k in packed.cache_rows], device=completion_ids.device))
    ids = packing.gather_slots(completion_ids, packed)
    targets = packing.gather_slots(completion_ids, replace(packed, step=packed.step + 1)) * packed.valid
    mask = packing.attention_mask(packed, prompt_mask[[rows[k] for k in packed.cache_rows]], _attention(core))
    with scoring_head(model, targets, keep=packed.valid, **head) as scorer:
        model(input_ids=ids, attention_mask=mask, position_ids=packing.gather_slots(positions, packed),
              **cache_argument(core.forward, cache), use_cache=True, logits_to_keep=ids.shape[1])
    return tuple(packing.unpack(t, packed, count, steps - 1) for t in scorer.scores)


def _with_turn_features(adapter, inputs: dict, full: dict, features: ImageFeatures, core) -> dict:
    """The completion pass's kwargs with the tool images' features in place (the adapter's own hook, as for a
    prompt); token-shaped inputs the forward reads beside the embeddings (e.g. which tokens form an image block)
    go in whole, since masks built from them index the full sequence."""
    n_tokens = int((inputs["input_ids"] == adapter.image_token_id).sum())
    if n_tokens != features.flat.shape[0]:
        raise ImageTokenMismatch(f"{adapter.family}: the completions hold {n_tokens} image tokens but their tool "
                                 f"turns give {features.flat.shape[0]} image features")
    kept = {k: full[k] for k in adapter.embedding_forward_keys if k in full}
    return adapter.inputs_with_features({**inputs, **kept}, features, core)
