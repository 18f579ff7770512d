"""Rollout pieces: EOS masking and the generated-placeholder guard."""

from __future__ import annotations

import pytest
import torch

from vlm_grpo.adapters import ImageTokenMismatch
from vlm_grpo.grpo.rollout.generation import check_no_placeholders, mask_after_eos


def test_mask_keeps_tokens_through_the_first_eos():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 3, 3, 3, 3]])
    assert mask_after_eos(ids, [2]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert mask_after_eos(ids, [2, 9]).tolist()[1] == [1, 1, 1, 1, 1]


class _Adapter:
    image_token_id = 42


def test_generated_placeholder_names_the_sample():
    ids = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 42, 3], [4, 5, 6]])
    mask = torch.ones_like(ids)
    with pytest.raises(ImageTokenMismatch, match="sample 1, completion 0"):
        check_no_placeholders(_Adapter(), ids, mask, num_generations=2)
    mask[2, 1:] = 0  # after EOS: never trained on, so allowed
    check_no_placeholders(_Adapter(), ids, mask, num_generations=2)
