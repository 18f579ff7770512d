"""Pretraining a random vision tower before it is composed, as a tower a user brings would have been: each patch
learns to say what its cell of the scene holds (the recipe's `cells` field: a class per cell of a square grid, 0
empty), through a linear head that is dropped afterwards.

Why: a random tower aligned through a frozen LM did not learn to see in the steps this budget has. Its projected
features collapsed toward one vector that served as a soft prompt (the same for every image), and the caption loss
stayed at the text prior's over 100+ steps, whatever the caption or learning rate (docs/smollm2-learns-to-see.md).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import torch


def patch_targets(cells: list[int], patches_per_side: int) -> list[int]:
    """The cell labels on the tower's patch grid: each patch takes the label of the cell it lies in."""
    side = math.isqrt(len(cells))
    if side * side != len(cells) or patches_per_side % side:
        raise ValueError(f"tower pretraining: {len(cells)} cell labels do not tile the tower's "
                         f"{patches_per_side} x {patches_per_side} patches")
    k = patches_per_side // side
    return [cells[(r // k) * side + c // k] for r in range(patches_per_side) for c in range(patches_per_side)]


def pretrain_tower(tower_dir: Path, recipe, recipe_options: dict[str, Any], steps: int, batch_size: int,
                   learning_rate: float, seed: int, say: Callable[[str], None] = print) -> dict[str, float]:
    """Train the SigLIP tower in `tower_dir` on the recipe's cell labels (train split) and save it in place;
    returns the patch accuracy on held-out (test split) images before and after."""
    from transformers import SiglipImageProcessor, SiglipVisionModel

    tower = SiglipVisionModel.from_pretrained(tower_dir)
    processor = SiglipImageProcessor.from_pretrained(tower_dir)
    side = tower.config.image_size // tower.config.patch_size
    train = recipe.build(split="train", size=steps * batch_size, seed=seed, **recipe_options)
    if "cells" not in train[0].fields:
        raise ValueError(f"tower pretraining needs the recipe to give each sample's cell labels (fields['cells']); "
                         f"{recipe.name} does not")
    probe = recipe.build(split="train", size=256, seed=seed, **recipe_options)  # built once: the classes seen
    classes = 1 + max(max(probe[i].fields["cells"]) for i in range(len(probe)))
    torch.manual_seed(seed)
    head = torch.nn.Linear(tower.config.hidden_size, classes)
    params = [*tower.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    heldout = recipe.build(split="test", size=256, seed=seed, **recipe_options)

    def batch(data, start, size):
        samples = [data[i] for i in range(start, start + size)]
        pixels = processor([s.images[0] for s in samples], return_tensors="pt")["pixel_values"]
        targets = torch.tensor([patch_targets(s.fields["cells"], side) for s in samples])
        return pixels, targets

    def accuracy() -> float:
        tower.eval()
        pixels, targets = batch(heldout, 0, len(heldout))
        with torch.no_grad():
            logits = head(tower(pixel_values=pixels).last_hidden_state)
        tower.train()
        return (logits.argmax(-1) == targets).float().mean().item()

    before, started = accuracy(), time.time()
    tower.train()
    for step in range(steps):
        pixels, targets = batch(train, step * batch_size, batch_size)
        logits = head(tower(pixel_values=pixels).last_hidden_state)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, classes), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if (step + 1) % max(1, steps // 5) == 0:
            say(f"tower: step {step + 1}/{steps}, loss {loss.item():.4f}")
    after = accuracy()
    tower.eval().save_pretrained(tower_dir)
    say(f"tower: held-out patch accuracy {before:.3f} -> {after:.3f} ({time.time() - started:.0f} s)")
    return {"patch_accuracy_before": before, "patch_accuracy_after": after}
