"""Pretraining a random vision tower before it is composed, as a tower a user brings would have been: each patch
learns to say what its cell of the scene holds (the recipe's `cells` field: a class per cell of a square grid, 0
empty), through a linear head that is dropped afterwards. With `counts: true`, every patch also learns to say the
whole image's counts (the recipe's `counts` field: small integers, one per thing counted), so that a small LM reads
how many from any one image token instead of counting tokens (measured: a 135M LM does not learn to count 16 image
tokens that each carry their cell, docs/smollm2-learns-to-see.md).

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
        raise ValueError(f"{len(cells)} cell labels do not tile the tower's "
                         f"{patches_per_side} x {patches_per_side} patches")
    k = patches_per_side // side
    return [cells[(r // k) * side + c // k] for r in range(patches_per_side) for c in range(patches_per_side)]


def pretrain_tower(tower_dir: Path, recipe, recipe_options: dict[str, Any], steps: int, batch_size: int,
                   learning_rate: float, seed: int, counts: bool = False,
                   say: Callable[[str], None] = print) -> dict[str, float]:
    """Train the SigLIP tower in `tower_dir` on the recipe's cell labels (train split), and its counts when asked,
    and save it in place; returns the held-out (test split) patch accuracy before and after, and with counts the
    share of held-out counts every patch states right."""
    from transformers import SiglipImageProcessor, SiglipVisionModel

    tower = SiglipVisionModel.from_pretrained(tower_dir)
    processor = SiglipImageProcessor.from_pretrained(tower_dir)
    side = tower.config.image_size // tower.config.patch_size
    train = recipe.build(split="train", size=steps * batch_size, seed=seed, **recipe_options)
    if "cells" not in train[0].fields:
        raise ValueError(f"tower pretraining needs the recipe to give each sample's cell labels (fields['cells']); "
                         f"{recipe.name} does not")
    if counts and "counts" not in train[0].fields:
        raise ValueError(f"tower pretraining with counts needs the recipe to give each sample's counts "
                         f"(fields['counts']); {recipe.name} does not")
    probe = recipe.build(split="train", size=256, seed=seed, **recipe_options)  # built once: the classes seen
    classes = 1 + max(max(probe[i].fields["cells"]) for i in range(len(probe)))
    torch.manual_seed(seed)
    head = torch.nn.Linear(tower.config.hidden_size, classes)
    # counts: one classifier per thing counted, 0..most seen, applied to every patch
    counted = len(probe[0].fields["counts"]) if counts else 0
    most = 1 + max(max(probe[i].fields["counts"]) for i in range(len(probe))) if counts else 0
    count_head = torch.nn.Linear(tower.config.hidden_size, counted * most) if counts else None
    params = [*tower.parameters(), *head.parameters(), *(count_head.parameters() if counts else ())]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    heldout = recipe.build(split="test", size=256, seed=seed, **recipe_options)

    def batch(data, start, size):
        samples = [data[i] for i in range(start, start + size)]
        pixels = processor([s.images[0] for s in samples], return_tensors="pt")["pixel_values"]
        targets = torch.tensor([patch_targets(s.fields["cells"], side) for s in samples])
        # counts above the largest seen in the class probe share its class
        totals = torch.tensor([s.fields["counts"] for s in samples]).clamp(max=most - 1) if counts else None
        return pixels, targets, totals

    def count_logits(hidden: torch.Tensor) -> torch.Tensor:  # (batch, patches, counted, 0..most)
        return count_head(hidden).reshape(*hidden.shape[:2], counted, most)

    def accuracy() -> tuple[float, float | None]:
        tower.eval()
        pixels, targets, totals = batch(heldout, 0, len(heldout))
        with torch.no_grad():
            hidden = tower(pixel_values=pixels).last_hidden_state
        tower.train()
        patch = (head(hidden).argmax(-1) == targets).float().mean().item()
        if not counts:
            return patch, None
        stated = count_logits(hidden).argmax(-1)  # every patch's statement of every count
        return patch, (stated == totals[:, None, :]).float().mean().item()

    (before, _), started = accuracy(), time.time()
    tower.train()
    for step in range(steps):
        pixels, targets, totals = batch(train, step * batch_size, batch_size)
        hidden = tower(pixel_values=pixels).last_hidden_state
        loss = torch.nn.functional.cross_entropy(head(hidden).reshape(-1, classes), targets.reshape(-1))
        if counts:
            per_patch = totals[:, None, :].expand(-1, hidden.shape[1], -1)
            loss = loss + torch.nn.functional.cross_entropy(count_logits(hidden).reshape(-1, most), per_patch.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if (step + 1) % max(1, steps // 5) == 0:
            say(f"tower: step {step + 1}/{steps}, loss {loss.item():.4f}")
    after, count_accuracy = accuracy()
    tower.eval().save_pretrained(tower_dir)
    counted_note = f", counts stated right by every patch {count_accuracy:.3f}" if counts else ""
    say(f"tower: held-out patch accuracy {before:.3f} -> {after:.3f}{counted_note} ({time.time() - started:.0f} s)")
    return {"patch_accuracy_before": before, "patch_accuracy_after": after,
            **({"count_accuracy_after": count_accuracy} if counts else {})}
