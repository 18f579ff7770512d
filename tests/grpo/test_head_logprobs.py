"""Log-probs straight from hidden states (the LM head applied chunk by chunk, recomputed in backward) equal the
full teacher-forced logits' log-softmax, and no vocabulary-sized tensor of all positions ever exists."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.adapters.samples import mixed_batch
from vlm_grpo.adapters.registry import family_class
from vlm_grpo.adapters.teacher_forcing import completion_logits
from vlm_grpo.grpo.logprobs import lm_head
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


class _VocabSizedTensors(TorchDispatchMode):
    """Records the size of every tensor an operation produces (or writes, `out=`) whose last dimension is the
    vocabulary, the model's weights and the head's gradient (weight-sized, whatever the positions) aside."""

    def __init__(self, vocab, model):
        super().__init__()
        self.vocab, self.sizes = vocab, []
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.head_size = model.get_output_embeddings().weight.numel()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]:
            weight_like = t.untyped_storage().data_ptr() in self.weights or t.numel() == self.head_size
            if t.dim() and t.shape[-1] == self.vocab and not weight_like:
                self.sizes.append(t.numel())
        return out


@pytest.mark.parametrize("fused", [True, False])
def test_no_vocabulary_sized_tensor_of_all_positions_exists(fused, monkeypatch):
    """With chunks of 3 rows, every logits-shaped tensor made in forward and backward stays chunk-sized, and no
    tensor saved for backward is logits-shaped at all beyond a chunk (the fused path saves none)."""
    adapter, batch, ids, mask = _setup("qwen2_5_vl")
    if not fused:  # the generic path: checkpointed chunks through the head module
        monkeypatch.setattr(lm_head, "fusable", lambda head, hidden: False)
    vocab = adapter.model.get_output_embeddings().weight.shape[0]
    saved = []

    def keep(t):
        if t.dim() and t.shape[-1] == vocab:  # logits-shaped
            saved.append(t.numel())
        return t

    with _VocabSizedTensors(vocab, adapter.model) as made, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        scores = score_completions(adapter, batch, ids, mask, chunk_bytes=4 * vocab * 3)
        scores.logps.sum().backward()
    assert made.sizes and max(made.sizes) == 3 * vocab  # chunk by chunk, forward and backward
    assert saved == [] or (not fused and max(saved) <= 3 * vocab)  # never the logits of all 15 positions
    assert adapter.model.get_output_embeddings().weight.grad.abs().sum() > 0


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
    from vlm_grpo.grpo.logprobs.completions import ScoreOptions, group_scores

    adapter, batch, ids, mask = _setup("qwen2_5_vl")
    index = list(range(len(batch)))
    weights = torch.linspace(-1.0, 1.0, ids.numel()).view_as(ids)
    head = adapter.model.get_output_embeddings().weight
    plain = group_scores(adapter, batch, index, ids, mask, options=ScoreOptions(
        share_prompt=share_prompt, with_entropy=True, temperature=0.7, chunk_bytes=4 * 700 * 3))
    assert not plain.entropy.requires_grad
    got = group_scores(adapter, batch, index, ids, mask, options=ScoreOptions(
        share_prompt=share_prompt, with_entropy=True, entropy_grad=True, temperature=0.7, chunk_bytes=4 * 700 * 3))
    torch.testing.assert_close(got.entropy, plain.entropy, rtol=0, atol=1e-6)
    adapter.model.zero_grad(set_to_none=True)
    (got.entropy * weights * mask).sum().backward()
    grad_got = head.grad.clone()
    adapter.model.zero_grad(set_to_none=True)
    full = torch.log_softmax(completion_logits(adapter, batch, ids, mask).float() / 0.7, -1)
    want = -(full.exp() * full).sum(-1)
    (want * weights * mask).sum().backward()
    assert (got.entropy - want)[mask.bool()].abs().max().item() <= 1e-4  # after a completion's end: nothing scored
    assert head.grad.norm() > 0
    assert ((grad_got - head.grad).norm() / head.grad.norm()).item() <= 1e-4


@pytest.mark.parametrize("softcap, temperature, bias, frozen, entropy", [
    (None, 1.0, False, False, True), (None, 0.6, True, False, False), (2.0, 0.8, True, False, True),
    (None, 0.7, True, True, True), (None, 1.3, False, True, False), (2.0, 1.0, False, True, True),
])
def test_fused_head_equals_autograd_log_softmax(softcap, temperature, bias, frozen, entropy):
    """The fused path (one buffer, hand-written backward) against autograd through the full logits: log-probs,
    entropy, argmax hits (a tie included: the first maximum wins, as argmax says) and the gradients of the hidden
    states, the weight and the bias (a frozen head: the hidden states' only)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=bias)
    hidden, targets = torch.randn(7, 8, requires_grad=True), torch.randint(50, (7,))
    with torch.no_grad():  # row 6: tokens 4 and 9 tie for the maximum; row 5: its target is the maximum
        head.weight[9] = head.weight[4]
        if bias:
            head.bias[9] = head.bias[4]
        hidden[6] = head.weight[4] * 5
        targets[6] = 9
        targets[5] = head(hidden[5]).argmax()  # softcap and temperature keep the order
    weights = torch.linspace(-1.0, 2.0, 7)
    head.requires_grad_(not frozen)  # frozen (LoRA): only the hidden states get a gradient
    assert lm_head.fusable(head, hidden)
    got = chunked_scores(head, hidden, targets, temperature=temperature, softcap=softcap, with_entropy=entropy,
                         chunk_bytes=4 * 50 * 3)
    (got[0] * weights).sum().backward()
    grads = [t.grad.clone() for t in (hidden, head.weight, head.bias) if t is not None and t.requires_grad]
    for t in (hidden, head.weight, head.bias):
        if t is not None:
            t.grad = None
    logits = head(hidden)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    full = torch.log_softmax(logits / temperature, -1)
    want = full.gather(-1, targets[:, None]).squeeze(-1)
    (want * weights).sum().backward()
    assert (got[0] - want).abs().max().item() <= 1e-6
    assert torch.allclose(got[1], -(full.exp() * full).sum(-1) if entropy else torch.zeros(7), atol=1e-5)
    assert torch.equal(got[2], full.argmax(-1) == targets) and got[2][5] and not got[2][6]
    theirs_all = [t.grad for t in (hidden, head.weight, head.bias) if t is not None and t.requires_grad]
    assert len(grads) == len(theirs_all) == (1 if frozen else 2 + bias)
    for mine, theirs in zip(grads, theirs_all):
        assert torch.allclose(mine, theirs, atol=1e-6), (mine - theirs).abs().max()


@pytest.mark.parametrize("bias, frozen, entropy", [(False, False, True), (True, False, False), (False, True, True)])
def test_fused_head_in_bf16_rounds_as_autograd_over_bf16_logits(bias, frozen, entropy):
    """A head stored in bf16 (mixed_precision bf16): the fused path multiplies in bf16 and reduces in float32, as
    autograd over the bf16 product upcast to float32 does; its log-probs and gradients (each in the weight's dtype)
    agree with that reference to bf16's rounding."""
    torch.manual_seed(1)
    head = torch.nn.Linear(64, 300, bias=bias).to(torch.bfloat16)
    hidden = torch.randn(9, 64, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(300, (9,))
    weights = torch.linspace(-1.0, 2.0, 9)
    head.requires_grad_(not frozen)
    assert lm_head.fusable(head, hidden)
    got = chunked_scores(head, hidden, targets, temperature=0.8, with_entropy=entropy, chunk_bytes=4 * 300 * 4)
    assert got[0].dtype == torch.float32
    (got[0] * weights).sum().backward()
    tensors = [t for t in (hidden, head.weight, head.bias) if t is not None and t.requires_grad]
    grads = [t.grad.clone() for t in tensors]
    assert all(g.dtype == torch.bfloat16 for g in grads)
    for t in tensors:
        t.grad = None
    full = torch.log_softmax(head(hidden).float() / 0.8, -1)
    want = full.gather(-1, targets[:, None]).squeeze(-1)
    (want * weights).sum().backward()
    assert (got[0] - want).abs().max().item() <= 1e-5  # the same bf16 products, the same float32 reductions
    if entropy:
        assert torch.allclose(got[1], -(full.exp() * full).sum(-1), atol=1e-4)
    for mine, t in zip(grads, tensors):
        theirs = t.grad.float()
        assert ((mine.float() - theirs).norm() / theirs.norm()).item() <= 2e-2  # bf16 products: 2^-8 per rounding
