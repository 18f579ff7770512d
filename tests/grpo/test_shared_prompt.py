"""The shared prompt in training: each prompt runs once and its KV cache serves its G completions; log-probs,
entropy and gradients (vision tower included) equal one full forward per row, on every family."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from tests.adapters.samples import mixed_batch, user_turn
from tests.conftest import families_with
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.grpo.logprobs.completions import ScoreOptions, group_scores
from vlm_grpo.grpo.logprobs.prompt_cache import differentiable_prompt_cache

G, T = 2, 5


def _case(family):
    adapter = family_class(family).tiny(seed=0)
    conversations, images = mixed_batch(adapter)
    conversations.append(user_turn(0, "Say something without a picture."))
    images.append([])
    prompts = adapter.encode_prompts(conversations, images)
    banned = set(adapter.suppressed_token_ids()) | set(adapter.eos_token_ids)
    allowed = torch.tensor([i for i in range(len(adapter.tokenizer)) if i not in banned])
    ids = allowed[torch.randint(len(allowed), (len(prompts) * G, T), generator=torch.Generator().manual_seed(0))]
    mask = torch.ones_like(ids)
    mask[1, 3:] = 0  # a completion that ended early
    return adapter, prompts, ids, mask


def _run(adapter, prompts, ids, mask, share_prompt):
    adapter.model.zero_grad(set_to_none=True)
    index = [r // G for r in range(len(prompts) * G)]
    layers = adapter.model.get_decoder().layers
    seen = []
    hook = layers[0].register_forward_pre_hook(
        lambda m, a, k: seen.append((a[0] if a else k["hidden_states"]).shape[:2]), with_kwargs=True)
    scores = group_scores(adapter, prompts, index, ids, mask, options=ScoreOptions(
        share_prompt=share_prompt, with_entropy=True, with_hits=True, temperature=0.8))
    hook.remove()
    weights = torch.linspace(-1.0, 1.0, ids.numel()).view_as(ids)
    (scores.logps * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in adapter.model.named_parameters() if p.grad is not None}
    return scores, grads, sum(rows * length for rows, length in seen)


def test_only_recurrent_caches_are_not_differentiable():
    assert differentiable_prompt_cache(family_class("qwen2_5_vl").tiny(seed=0).model)
    assert not differentiable_prompt_cache(family_class("qwen3_5").tiny(seed=0).model)


@pytest.mark.parametrize("family", families_with("shares_prefix"))
def test_shared_prompt_equals_one_forward_per_row(family):
    adapter, prompts, ids, mask = _case(family)
    plain, plain_grads, plain_tokens = _run(adapter, prompts, ids, mask, share_prompt=False)
    shared, shared_grads, shared_tokens = _run(adapter, prompts, ids, mask, share_prompt=True)
    kept = mask.bool()  # after a completion's end there is no token to score
    assert (plain.logps - shared.logps)[kept].abs().max().item() <= 1e-5
    assert (plain.entropy - shared.entropy)[kept].abs().max().item() <= 1e-5
    assert torch.equal(plain.hits[kept], shared.hits[kept])
    if differentiable_prompt_cache(adapter.model):  # the head built no logits for the padding
        assert not shared.logps[~kept].any() and not shared.entropy[~kept].any()
    assert plain_grads.keys() == shared_grads.keys()
    a = torch.cat([plain_grads[n].flatten() for n in plain_grads])
    b = torch.cat([shared_grads[n].flatten() for n in plain_grads])
    assert ((a - b).norm() / a.norm()).item() <= 1e-4
    largest = max(g.norm() for g in plain_grads.values())
    for name, grad in plain_grads.items():  # every parameter that gets a real gradient (vision tower included)
        if grad.norm() > 1e-3 * largest:
            assert ((grad - shared_grads[name]).norm() / grad.norm()).item() <= 1e-4, name
    assert any(adapter.module_group_of(n) == "vision" for n in plain_grads)
    length, rows = prompts.input_ids.shape[1], ids.shape[0]
    assert plain_tokens == rows * (length + T)  # the language model saw every prompt G times ...
    if differentiable_prompt_cache(adapter.model):
        assert shared_tokens == len(prompts) * length + rows * T  # ... and now once
    else:  # recurrent cache layers are updated in place (no gradient through them): the plain path, stated
        assert shared_tokens == plain_tokens


def _packing_case(family):
    adapter = family_class(family).tiny(seed=0)
    conversations, images = mixed_batch(adapter)
    prompts = adapter.encode_prompts(conversations, images)
    groups, width = 4, 9
    banned = set(adapter.suppressed_token_ids()) | set(adapter.eos_token_ids)
    allowed = torch.tensor([i for i in range(len(adapter.tokenizer)) if i not in banned])
    rows = len(prompts) * groups
    ids = allowed[torch.randint(len(allowed), (rows, width), generator=torch.Generator().manual_seed(1))]
    lengths = torch.tensor([9, 3, 5, 2, 1, 7, 4, 6, 8, 2, 3, 9] * rows)[:rows]  # a completion of 1: nothing to feed
    mask = (torch.arange(width) < lengths[:, None]).long()
    return adapter, prompts, [r // groups for r in range(rows)], ids, mask


@pytest.mark.parametrize("family", families_with("shares_prefix"))
def test_packed_completions_equal_padded_rows(family):
    """Padding-free: the completion pass over packed rows gives the padded rows' log-probs, entropies, argmax hits and
    gradients (float32, within 1e-5), in fewer rows; a family or cache that cannot pack takes the padded rows."""
    adapter, prompts, index, ids, mask = _packing_case(family)
    results = {}
    for mode in ("off", "on"):
        adapter.model.zero_grad(set_to_none=True)
        seen = []
        hook = adapter.model.get_decoder().layers[0].register_forward_pre_hook(
            lambda m, a, k: seen.append((a[0] if a else k["hidden_states"]).shape[:2]), with_kwargs=True)
        scores = group_scores(adapter, prompts, index, ids, mask, options=ScoreOptions(
            share_prompt=True, with_entropy=True, with_hits=True, temperature=0.8, padding_free=mode))
        hook.remove()
        (scores.logps * torch.linspace(-1.0, 1.0, ids.numel()).view_as(ids) * mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in adapter.model.parameters() if p.grad is not None])
        results[mode] = scores, grads, seen[-1]  # the last forward: the completion pass
    (padded, padded_grads, padded_pass), (packed, packed_grads, packed_pass) = results["off"], results["on"]
    kept = mask.bool()
    assert (padded.logps - packed.logps)[kept].abs().max().item() <= 1e-5
    assert (padded.entropy - packed.entropy)[kept].abs().max().item() <= 1e-5
    assert torch.equal(padded.hits[kept], packed.hits[kept])
    assert ((padded_grads - packed_grads).norm() / padded_grads.norm()).item() <= 1e-5
    cache = DynamicCache(config=adapter.model.config.get_text_config())
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers) or not differentiable_prompt_cache(adapter.model):
        assert packed_pass == padded_pass  # a window or a recurrent state keeps no whole prompt to continue
    else:  # completions fed 8+2+4+1+0+6+3+5 | 7+1+2+8 tokens: per prompt, first-fit into rows of 8
        assert padded_pass == (ids.shape[0], ids.shape[1]) and packed_pass == (4 + 3, 8)
