"""Log-probs straight from hidden states (the LM head applied chunk by chunk, recomputed in backward) equal the
full teacher-forced logits' log-softmax, and no vocabulary-sized tensor of all positions ever exists."""

from __future__ import annotations

import pytest
import torch

from tests.adapters.samples import mixed_batch
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.adapters.teacher_forcing import completion_logits
from vlm_grpo.grpo.logprobs.lm_head import chunked_scores, score_completions

T = 5


def _setup(family, seed=0):
    adapter = family_class(family).tiny(seed=0)
    conversations, images = mixed_batch(adapter)
    batch = adapter.encode_prompts(conversations, images)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(adapter.tokenizer) - 60, (len(batch), T), generator=gen)  # ordinary text ids
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0
    return adapter, batch, ids, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scores_equal_the_full_logits_with_gradients(family, temperature):
    adapter, batch, ids, mask = _setup(family)
    weights = torch.linspace(-1.0, 1.0, ids.numel()).view_as(ids)
    head = adapter.model.get_output_embeddings().weight
    got = score_completions(adapter, batch, ids, mask, temperature=temperature, with_entropy=True, chunk_bytes=4 * 700 * 3)
    (got.logps * weights * mask).sum().backward()
    grad_got = head.grad.clone()
    adapter.model.zero_grad(set_to_none=True)
    full = torch.log_softmax(completion_logits(adapter, batch, ids, mask).float() / temperature, -1)
    want = full.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (want * weights * mask).sum().backward()
    assert (got.logps - want).abs().max().item() <= 1e-5
    assert torch.allclose(got.entropy, -(full.exp() * full).sum(-1), atol=1e-4)
    assert torch.equal(got.hits, full.argmax(-1) == ids)
    assert ((grad_got - head.grad).norm() / head.grad.norm()).item() <= 1e-4


def test_no_vocabulary_sized_tensor_of_all_positions_exists():
    """With chunks of 3 rows, the head's outputs and every tensor saved for backward stay chunk-sized."""
    adapter, batch, ids, mask = _setup("qwen2_5_vl")
    vocab = adapter.model.get_output_embeddings().weight.shape[0]
    outputs, saved = [], []
    hook = adapter.model.get_output_embeddings().register_forward_hook(lambda m, i, o: outputs.append(o.numel()))

    def keep(t):
        if t.dim() and t.shape[-1] == vocab:  # logits-shaped
            saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        scores = score_completions(adapter, batch, ids, mask, chunk_bytes=4 * vocab * 3)
    scores.logps.sum().backward()
    hook.remove()
    assert len(outputs) >= 2 * (ids.numel() // 3) and max(outputs) == 3 * vocab  # forward and recompute, chunk by chunk
    assert saved == [] or max(saved) <= 3 * vocab  # never the logits of all 15 positions


def test_softcapped_heads_are_scored_with_the_cap():
    head = torch.nn.Linear(8, 50)
    hidden, targets = torch.randn(6, 8), torch.randint(50, (6,))
    logps, _, _ = chunked_scores(head, hidden, targets, softcap=2.0, chunk_bytes=4 * 50 * 4)
    logits = torch.tanh(head(hidden) / 2.0) * 2.0
    want = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    assert torch.allclose(logps, want, atol=1e-6)


@pytest.mark.parametrize("share_prompt", [False, True], ids=["one_forward", "shared_prompt"])
def test_entropy_carries_the_full_logits_gradient_when_asked(share_prompt):
    """An entropy bonus trains on the entropy (TRL's entropy has a gradient): with entropy_grad, the chunked entropy's
    gradient equals the full logits' entropy gradient, on both scoring paths; without it, the entropy has none."""
    from vlm_grpo.grpo.logprobs.completions import group_scores

    adapter, batch, ids, mask = _setup("qwen2_5_vl")
    index = list(range(len(batch)))
    weights = torch.linspace(-1.0, 1.0, ids.numel()).view_as(ids)
    head = adapter.model.get_output_embeddings().weight
    plain = group_scores(adapter, batch, index, ids, mask, share_prompt=share_prompt, with_entropy=True,
                         temperature=0.7, chunk_bytes=4 * 700 * 3)
    assert not plain.entropy.requires_grad
    got = group_scores(adapter, batch, index, ids, mask, share_prompt=share_prompt, with_entropy=True,
                       entropy_grad=True, temperature=0.7, chunk_bytes=4 * 700 * 3)
    torch.testing.assert_close(got.entropy, plain.entropy, rtol=0, atol=1e-6)
    adapter.model.zero_grad(set_to_none=True)
    (got.entropy * weights * mask).sum().backward()
    grad_got = head.grad.clone()
    adapter.model.zero_grad(set_to_none=True)
    full = torch.log_softmax(completion_logits(adapter, batch, ids, mask).float() / 0.7, -1)
    want = -(full.exp() * full).sum(-1)
    (want * weights * mask).sum().backward()
    assert (got.entropy - want).abs().max().item() <= 1e-4
    assert head.grad.norm() > 0
    assert ((grad_got - head.grad).norm() / head.grad.norm()).item() <= 1e-4
