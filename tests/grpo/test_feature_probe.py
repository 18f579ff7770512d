"""scripts/feature_probe.py: the per-token linear probe reads labels that the features carry, at their own token,
and does not read labels they do not carry."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SPEC = importlib.util.spec_from_file_location("feature_probe", Path(__file__).parents[2] / "scripts" / "feature_probe.py")
probe = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(probe)


def scenes(n: int, generator: torch.Generator, carried: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """n images of 4 tokens, 5 classes (0 empty); the class is written into its token's features when `carried`."""
    labels = torch.randint(0, 5, (n, 4), generator=generator)
    x = torch.randn(n, 4, 8, generator=generator)
    if carried:
        x[..., :5] += 4 * torch.nn.functional.one_hot(labels, 5).float()
    return x, labels


def test_labels_the_tokens_carry_are_read():
    g = torch.Generator().manual_seed(0)
    scores = probe.probe_accuracy(*scenes(400, g, True), *scenes(200, g, True))
    assert scores["cells"] > 0.95 and scores["non_empty_cells"] > 0.95


def test_labels_the_tokens_do_not_carry_are_not_read():
    g = torch.Generator().manual_seed(1)
    scores = probe.probe_accuracy(*scenes(400, g, False), *scenes(200, g, False))
    assert scores["cells"] < 0.4  # 5 classes: chance 0.2


def test_a_label_at_another_token_is_not_credited_to_this_one():
    """Token 0 carries token 1's label and the reverse: a per-position probe must not find them in place."""
    g = torch.Generator().manual_seed(2)
    x, y = scenes(400, g, True)
    tx, ty = scenes(200, g, True)
    swapped = lambda t: t[:, [1, 0, 2, 3]]
    scores = probe.probe_accuracy(swapped(x), y, swapped(tx), ty)
    assert scores["cells"] < 0.75  # tokens 2, 3 still read (half the cells), tokens 0, 1 at chance
