"""Checkpoints shipped inside the package, loaded with `--model pretrained:NAME` (no download).

`shapes-tiny`: a 0.5M-parameter LLaVA-style VLM (SigLIP vision tower + Qwen2 language model, the
`hybrid_llava` family's ordinary checkpoint) trained by the project's own `vlm-grpo sft` on `shapes`;
see shapes-tiny/README.md for the command, seed, wall time and training curve. It is the default
model of `vlm-grpo train`, which then also uses the GRPO settings in `RUN_DEFAULTS` below (a run on
any other model does not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PREFIX = "pretrained:"
ROOT = Path(__file__).resolve().parent
DEFAULT = "shapes-tiny"  # the default model of `vlm-grpo train`

# Settings a GRPO run on the checkpoint uses unless the config file or command line says otherwise
# (they sit above the recipe's defaults): `vlm-grpo train` with no arguments is the offline main job,
# a few minutes on 2 CPU cores, held-out accuracy measured before and after, charts in the run dir.
RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "shapes-tiny": {
        "data": {"recipe": "shapes", "recipe_options": {"image_size": 64}, "train_size": 100_000, "batch_size": 16,
                 "num_generations": 8},
        # temperature 1: the checkpoint writes the full describe-reason-answer form in about 11% of its samples
        # (7% at 0.7), which is what GRPO has to find and reinforce
        "generation": {"max_new_tokens": 24, "temperature": 1.0},
        "loss": {"beta": 0.1},
        # vision tower and projector frozen: GRPO changes how the model answers, not what it sees
        "optim": {"learning_rate": 5e-5, "freeze": ["vision", "projector"]},
        "max_steps": 200,
        "eval": {"before_after": True, "size": 200, "eval_batch_size": 50, "data_seed": 0},
        "logging": {"plot": True},
    },
}


def names() -> list[str]:
    return sorted(p.name for p in ROOT.iterdir() if (p / "config.json").is_file())


def path(name: str) -> Path:
    """The directory of shipped checkpoint `name` (ValueError naming the known ones if absent)."""
    out = ROOT / name
    if not (out / "config.json").is_file():
        raise ValueError(f"unknown pretrained checkpoint {name!r}; shipped: {', '.join(names()) or 'none'}")
    return out


def run_defaults(spec: str | None) -> dict[str, Any]:
    """The GRPO settings that go with model spec `spec` (empty unless it names a shipped checkpoint)."""
    if not spec or not spec.startswith(PREFIX):
        return {}
    return RUN_DEFAULTS.get(spec[len(PREFIX):], {})
