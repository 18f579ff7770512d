"""Does each image token the LM receives say what its grid cell holds? A linear probe per token position, trained on
the projected image features of training scenes and scored on held-out ones (docs/smollm2-learns-to-see.md,
"Where the image is lost"). High accuracy with a model that still cannot answer means the LM does not read what the
tower and projector deliver.

    .venv/bin/python scripts/feature_probe.py MODEL_DIR [--recipe scene_count] [--train 1500] [--test 400]

MODEL_DIR is a composed or trained model folder (a stage's final/). The recipe must give each sample's cell labels
(fields["cells"], one per image token), as scene_count's caption task does.
"""

from __future__ import annotations

import argparse

import torch


def projected_features(adapter, samples, batch: int = 100) -> torch.Tensor:
    """(samples, tokens, width): the image features as the LM receives them, one row per image token."""
    from vlm_grpo.experiment.words import image_tokens

    rows = []
    for start in range(0, len(samples), batch):
        with torch.no_grad():
            rows.append(image_tokens(adapter, [s.images[0] for s in samples[start:start + batch]]).float())
    return torch.cat(rows)


def probe_accuracy(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                   steps: int = 300, seed: int = 0) -> dict[str, float]:
    """Fit one linear classifier per token position (x: samples, tokens, width; y: samples, tokens) and score it on
    the test set: all cells, and the cells whose label is not 0 (not empty)."""
    torch.manual_seed(seed)
    mean, std = train_x.mean((0, 1)), train_x.std((0, 1)) + 1e-6
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    tokens, width, classes = train_x.shape[1], train_x.shape[2], int(max(train_y.max(), test_y.max())) + 1
    weight = torch.zeros(tokens, width, classes, requires_grad=True)
    bias = torch.zeros(tokens, classes, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=1e-2)
    for _ in range(steps):
        logits = torch.einsum("ntd,tdc->ntc", train_x, weight) + bias
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, classes), train_y.reshape(-1))
        optimizer.zero_grad()
        (loss + 1e-4 * weight.pow(2).sum()).backward()
        optimizer.step()
    with torch.no_grad():
        right = (torch.einsum("ntd,tdc->ntc", test_x, weight) + bias).argmax(-1) == test_y
    return {"cells": right.float().mean().item(), "non_empty_cells": right[test_y > 0].float().mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--recipe", default="scene_count")
    parser.add_argument("--train", type=int, default=1500)
    parser.add_argument("--test", type=int, default=400)
    args = parser.parse_args()

    from vlm_grpo.loader import load_model
    from vlm_grpo.recipes import get_recipe

    adapter = load_model(args.model, device="cpu", decide_cache=False)
    adapter.model.float().eval()
    recipe = get_recipe(args.recipe)
    sets = {}
    for split, size, seed in (("train", args.train, 0), ("test", args.test, 1)):
        data = recipe.build(split=split, size=size, seed=seed, task="caption")
        samples = [data[i] for i in range(size)]
        if "cells" not in samples[0].fields:
            raise SystemExit(f"{args.recipe}: its samples give no cell labels (fields['cells']); nothing to probe")
        sets[split] = (projected_features(adapter, samples), torch.tensor([s.fields["cells"] for s in samples]))
    if sets["train"][0].shape[1] != sets["train"][1].shape[1]:
        raise SystemExit(f"{sets['train'][0].shape[1]} image tokens but {sets['train'][1].shape[1]} cell labels per "
                         "image: the probe needs one token per cell")
    scores = probe_accuracy(*sets["train"], *sets["test"])
    print(f"held-out cell accuracy {scores['cells']:.3f}, non-empty cells {scores['non_empty_cells']:.3f}")


if __name__ == "__main__":
    main()
