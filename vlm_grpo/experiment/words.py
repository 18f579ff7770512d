"""Aligning the projector to the LM's own words (the align stage's `words` method): each image token learns to sit
where the LM keeps the words naming what its cell of the scene holds (the recipe's `cell_words` field: "red circle",
"empty"), at the sum of those words' input embeddings scaled by 1/sqrt(number of words). The LM and its embedding
table stay frozen: they are the target. Only the projector trains, against a regression loss, without an LM
forward, so it takes seconds.

Why: a 135M LM reads a word's embedding put in place of an image token (7 of 8 words named, scripts/soft_token_read.py),
but did not learn to read a projection trained through it on captions: after 150 caption steps a linear probe read
every cell from its token, and SFT still answered at chance (docs/smollm2-learns-to-see.md). Put at its words, the
image reaches the LM as something it already reads.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

from vlm_grpo.experiment.tower import patch_targets
from vlm_grpo.grpo.checkpoint.manifest import write_manifest


def word_vector(embeddings: torch.Tensor, tokenizer, name: str) -> torch.Tensor:
    """The input embedding the LM would give the words of `name` ("red circle"): the sum over their tokens (as they
    follow a space) scaled by 1/sqrt(count), so a two-word name keeps about one word's norm."""
    ids = tokenizer(" " + name.strip(), add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"projector words: {name!r} has no tokens")
    return embeddings[ids].sum(0) / math.sqrt(len(ids))


def image_tokens(adapter, images) -> torch.Tensor:
    """(images, tokens, width): the projected image features, as the LM receives them."""
    from vlm_grpo.adapters.features import flatten_pooled

    pixels = adapter.processor.image_processor(images, return_tensors="pt")["pixel_values"]
    features = flatten_pooled(adapter.model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output)
    return features.reshape(len(images), -1, features.shape[-1])


def align_to_words(model_dir: Path, out: Path, recipe, recipe_options: dict[str, Any], steps: int, batch_size: int,
                   learning_rate: float, seed: int, say: Callable[[str], None] = print) -> dict[str, float]:
    """Train the projector of the composed model in `model_dir` so that every image token sits at its cell's words,
    and save the model to `out`; returns the held-out share of image tokens whose nearest word vector (among the
    names seen) is their own cell's, before and after."""
    from vlm_grpo.loader import load_model

    adapter = load_model(str(model_dir), device="cpu", dtype="float32", decide_cache=False)
    model, tokenizer = adapter.model, adapter.processor.tokenizer
    projector = getattr(getattr(model, "model", model), "multi_modal_projector", None)
    if projector is None:
        raise ValueError(f"projector words: {model_dir} has no multi_modal_projector (a LLaVA-style composed model)")
    train = recipe.build(split="train", size=steps * batch_size, seed=seed, **recipe_options)
    if "cell_words" not in train[0].fields:
        raise ValueError(f"projector words need the recipe to name what each cell holds (fields['cell_words']); "
                         f"{recipe.name} does not")
    probe = recipe.build(split="test", size=256, seed=seed, **recipe_options)
    heldout = [probe[i] for i in range(len(probe))]
    embeddings = model.get_input_embeddings().weight.detach()
    vectors: dict[str, torch.Tensor] = {}  # every name met: its word vector

    def names_on_patches(sample, tokens: int) -> list[str]:
        side = math.isqrt(tokens)
        if side * side != tokens:
            raise ValueError(f"projector words: {tokens} image tokens are not a square grid")
        cells = sample.fields["cell_words"]
        for name in cells:
            if name not in vectors:
                vectors[name] = word_vector(embeddings, tokenizer, name)
        return [cells[i] for i in patch_targets(list(range(len(cells))), side)]

    def targets(samples, tokens: int) -> torch.Tensor:
        return torch.stack([torch.stack([vectors[n] for n in names_on_patches(s, tokens)]) for s in samples])

    def nearest() -> float:
        """Held-out share of image tokens whose nearest word vector, among the names met, is their cell's."""
        with torch.no_grad():
            tokens = image_tokens(adapter, [s.images[0] for s in heldout])
        said = [names_on_patches(s, tokens.shape[1]) for s in heldout]
        table = list(vectors)
        found = torch.cdist(tokens.reshape(-1, tokens.shape[-1]), torch.stack([vectors[n] for n in table])).argmin(-1)
        return sum(table[i] == name for i, name in zip(found.tolist(), (n for row in said for n in row))) / found.numel()

    for param in model.parameters():
        param.requires_grad_(False)
    for param in projector.parameters():
        param.requires_grad_(True)
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(projector.parameters(), lr=learning_rate)
    before, started = nearest(), time.time()
    for step in range(steps):
        samples = [train[i] for i in range(step * batch_size, (step + 1) * batch_size)]
        tokens = image_tokens(adapter, [s.images[0] for s in samples])
        loss = torch.nn.functional.mse_loss(tokens, targets(samples, tokens.shape[1]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % max(1, steps // 5) == 0:
            say(f"align (words): step {step + 1}/{steps}, loss {loss.item():.6f}")
    after = nearest()
    model.eval().to(torch.bfloat16).save_pretrained(out)  # bf16, as the training stages save
    adapter.processor.save_pretrained(out)
    write_manifest(out)
    say(f"align (words): held-out image tokens nearest their own cell's words {before:.3f} -> {after:.3f} "
        f"({time.time() - started:.0f} s)")
    return {"nearest_words_before": before, "nearest_words_after": after}
