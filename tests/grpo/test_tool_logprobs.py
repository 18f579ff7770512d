"""Log-probs of multi-turn trajectories (model turns, tool turns, tool images) in training.

The reference is independent of the loop: the whole conversation written out as text (the prompt through the chat
template, each model turn, each tool turn) and run through the processor with all of the row's images, then the
model's own forward from pixels. The loop's tokens must be exactly those, and every log-prob path (pixels, shared
image features, shared prompt KV cache, the rollout's features reused) must give its log-probs. Tool-result
tokens are in no loss term: their log-probs get no gradient.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_adapter
from tests.grpo.tool_scripts import call_text, every_family, scripted_rollout
from vlm_grpo.grpo.algorithm.losses import LossConfig, LossInputs, policy_loss
from vlm_grpo.grpo.logprobs.completions import ScoreOptions, group_scores

TOL = 1e-5  # as the shared-feature and shared-prompt tests
G = 2


def first(r: int) -> str:  # row 1 answers at once: rows differ in whether (and which) images their tools returned
    return "No tool needed: 5" if r == 1 else call_text("crop", x=8 * r, y=4 * r, width=40 + 8 * r, height=50)


def later(r: int) -> str:
    return "The answer is 7."


def _case(family):
    adapter = tiny_adapter(family)
    session, fmt, prompts, ro = scripted_rollout(adapter, first, later, num_generations=G)
    return adapter, session, fmt, prompts, ro


def _reference(adapter, session, fmt, prompts, ro, r):
    """(the processor's ids for row r's whole conversation, log p of its completion tokens from a pixel forward)."""
    p, eos = r // G, adapter.tokenizer.convert_ids_to_tokens(adapter.eos_token_ids[0])
    text = adapter.processor.apply_chat_template(session.conversations[p], add_generation_prompt=True, tokenize=False)
    images, messages, k = list(session.images[p]), ro.conversations[r], 0
    while k < len(messages):
        if messages[k]["role"] == "assistant":
            text += (first(r) if k == 0 else later(r)) + eos
            k += 1
            continue
        group = []
        while k < len(messages) and messages[k]["role"] == "tool":
            group.append(messages[k])
            k += 1
        text += fmt.tool_turn(group)
        images += [part["image"] for m in group if isinstance(m["content"], list) for part in m["content"]
                   if part["type"] == "image"]
    batch = adapter._to_batch(adapter._run_processor([text], [images]), [images])
    with torch.no_grad():
        logits = adapter.model(**adapter.model_inputs(batch)).logits[0].float()
    length, n = int(prompts.attention_mask[p].sum()), int(ro.completion_mask[r].sum())
    ids = batch.input_ids[0]
    return ids, torch.log_softmax(logits[length - 1 : length - 1 + n], -1).gather(-1, ids[length : length + n, None])[:, 0]


@pytest.mark.parametrize("family", every_family())
def test_trajectory_logprobs_equal_one_full_forward(family):
    adapter, session, fmt, prompts, ro = _case(family)
    images = ro.completion_images
    assert images is not None and images.rows == [[0], [], [1], [2]]  # per-completion tool images
    assert [len(c) for c in ro.conversations] == [3, 1, 3, 3]  # call, result, answer / a direct answer
    index = [r // G for r in range(len(ro.completions))]
    references = []
    for r in range(len(ro.completions)):
        ids, logps = _reference(adapter, session, fmt, prompts, ro, r)
        ours = torch.cat([prompts.input_ids[r // G][prompts.attention_mask[r // G].bool()],
                          ro.completion_ids[r][ro.completion_mask[r].bool()]])
        assert torch.equal(ids, ours), f"row {r}: the loop's tokens differ from the processor's"
        references.append(logps)
    paths = {"pixels": dict(share_features=False), "features": dict(share_prompt=False),
             "prompt cache": dict(share_prompt=True),
             "reused": dict(share_prompt=True, features=ro.features, turn_features=images.features)}
    for name, options in paths.items():
        with torch.no_grad():
            got = group_scores(adapter, prompts, index, ro.completion_ids, ro.completion_mask,
                               options=ScoreOptions(turns=images, **options)).logps
        for r, want in enumerate(references):
            assert (got[r, : len(want)] - want).abs().max().item() <= TOL, (name, r)


def test_tool_result_tokens_get_no_gradient():
    adapter, session, fmt, prompts, ro = _case("qwen2_5_vl")
    index = [r // G for r in range(len(ro.completions))]
    scores = group_scores(adapter, prompts, index, ro.completion_ids, ro.completion_mask,
                          options=ScoreOptions(turns=ro.completion_images, share_prompt=True))
    logps = scores.logps
    logps.retain_grad()
    loss_mask = ro.completion_mask * ro.tool_mask
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, _ = policy_loss(LossInputs(logps, advantages, loss_mask, ref_logps=logps.detach() + 0.01),
                          LossConfig(beta=0.04, max_completion_length=200))
    loss.backward()
    tool_tokens = ro.completion_mask.bool() & ~ro.tool_mask.bool()
    assert tool_tokens.sum() > 20  # the tool turns, image tokens included
    assert (logps.grad[tool_tokens] == 0).all()
    assert (logps.grad[loss_mask.bool()] != 0).all()  # every token the model wrote trains
    vision = [p.grad for n, p in adapter.model.named_parameters() if adapter.module_group_of(n) == "vision"]
    assert any(g is not None and g.abs().sum() > 0 for g in vision)  # what the tools showed shapes the answer
    adapter.model.zero_grad(set_to_none=True)
