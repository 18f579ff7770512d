"""The layout of padding-free completion passes (grpo/logprobs/packing.py): which completions share a packed row,
what each slot may see, when packing is chosen. The log-probs themselves are checked against the padded rows on
every family in test_shared_prompt.py."""

from __future__ import annotations

import random

import pytest
import torch

from vlm_grpo.grpo.logprobs import packing


def test_rows_hold_each_completion_once_within_its_prompt_and_width():
    draw = random.Random(0)
    for _ in range(200):
        groups = sorted(draw.randrange(4) for _ in range(draw.randrange(1, 24)))
        lengths = [draw.choice([0, 1, draw.randrange(1, 40)]) for _ in groups]
        rows = packing.pack_rows(lengths, groups)
        placed = [k for row in rows for k in row]
        assert sorted(placed) == [k for k, n in enumerate(lengths) if n > 0]
        for row in rows:
            assert len({groups[k] for k in row}) == 1  # one prompt's cache per packed row
            assert sum(lengths[k] for k in row) <= max(lengths)
        # first fit: no two rows of one prompt could have been merged from a completion that fits elsewhere
        by_group = {}
        for row in rows:
            by_group.setdefault(groups[row[0]], []).append(row)
        for members in by_group.values():
            for i, row in enumerate(members[1:], start=1):
                opener = row[0]  # the completion that opened this row fit in no earlier row of its prompt
                assert all(sum(lengths[k] for k in earlier) + lengths[opener] > max(lengths) for earlier in members[:i])


def test_slots_see_their_prompt_and_their_own_earlier_tokens():
    lengths, groups = [2, 3, 1], [0, 0, 0]
    packed = packing.plan(lengths, groups, torch.device("cpu"))
    assert packed.row.tolist() == [[1, 1, 1], [0, 0, 2]] and packed.step.tolist() == [[0, 1, 2], [0, 1, 0]]
    prompt = torch.tensor([[0, 1], [0, 1]])  # one left pad
    mask = packing.attention_mask(packed, prompt, "sdpa")[:, 0]
    assert mask.shape == (2, 3, 5)
    assert mask[1].int().tolist() == [[0, 1, 1, 0, 0],   # row 0, token 0: the prompt, itself
                                      [0, 1, 1, 1, 0],   # row 0, token 1
                                      [0, 1, 0, 0, 1]]   # row 2, token 0: not row 0's tokens
    eager = packing.attention_mask(packed, prompt, "eager")
    assert eager.dtype == torch.float32 and torch.equal(eager[:, 0] == 0, mask)


def test_a_pad_slot_sees_itself_only():
    packed = packing.plan([3, 1], [0, 1], torch.device("cpu"))  # two prompts: two rows, the second mostly pad
    mask = packing.attention_mask(packed, torch.ones(2, 1), "sdpa")[1, 0]
    assert mask.int().tolist() == [[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]


def test_unpack_puts_each_slot_at_its_token_and_keeps_the_gradient():
    packed = packing.plan([2, 3, 1], [0, 0, 0], torch.device("cpu"))
    values = torch.arange(6, dtype=torch.float32).view(2, 3).requires_grad_()
    out = packing.unpack(values, packed, rows=3, steps=4)
    assert out.tolist() == [[3, 4, 0, 0], [0, 1, 2, 0], [5, 0, 0, 0]]
    out.sum().backward()
    assert values.grad.tolist() == [[1, 1, 1], [1, 1, 1]]


@pytest.mark.parametrize("mask, expected", [
    ([[1, 1, 0], [1, 0, 0]], True), ([[1, 0, 1], [1, 1, 1]], False), ([[0, 0, 0], [1, 1, 1]], True)])
def test_only_one_run_of_tokens_per_completion_packs(mask, expected):
    assert packing.is_right_padded(torch.tensor(mask)) is expected


def test_when_packing_is_chosen():
    assert packing.worth_packing([8, 1, 1, 1], [0] * 4, "auto")  # 4 rows -> 1
    assert not packing.worth_packing([8, 1, 1, 1], [0, 1, 2, 3], "auto")  # every completion its own prompt
    assert not packing.worth_packing([8, 8, 7, 8], [0] * 4, "on")  # nothing to remove
    assert packing.worth_packing([8] * 9 + [7, 1], [0] * 11, "on")  # 11 rows -> 10: fewer ...
    assert not packing.worth_packing([8] * 9 + [7, 1], [0] * 11, "auto")  # ... but not by a tenth
    assert packing.worth_packing([8] * 8 + [7, 1], [0] * 10, "auto")  # 10 rows -> 9: a tenth
    assert not packing.worth_packing([8, 1, 1, 1], [0] * 4, "off")
