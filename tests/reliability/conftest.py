"""Shared tiny runs: one uninterrupted run per length, the reference interrupted and resumed runs must equal."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from vlm_grpo.cli import main

# A tiny GRPO run whose reward (tests/reliability/step_rewards.py) a test can make misbehave at a chosen step (no
# reward audit at the start: it calls the reward before step 1, which would spend the action meant for step 1).
RUN = ["--model", "tiny:qwen2_5_vl", "--data.recipe_options", "{image_size: 56}", "--max-new-tokens", "4",
       "--logging.progress", "false", "--learning-rate", "1e-3", "--reward", "tests.reliability.step_rewards:lowercase",
       "--guard.audit_at_start", "false"]


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "final" / "model.safetensors")


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="session")
def straight(tmp_path_factory):
    """`straight(n)`: the directory of an uninterrupted n-step run (made once per session)."""
    made = {}

    def run(steps: int):
        if steps not in made:
            out = tmp_path_factory.mktemp(f"straight{steps}")
            assert main(["train", *RUN, "--max-steps", str(steps), "--output-dir", str(out)]) == 0
            made[steps] = out
        return made[steps]

    return run


# A small experiment file: `.format(out=..., grpo=", more: settings", extra="top-level lines")` (braces doubled).
TOY_EXPERIMENT = """
name: toy
output_dir: {out}
compose: {{llm: smollm2, tower: {{hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
          num_attention_heads: 2, image_size: 32, patch_size: 16}}}}
sft: {{data: {{recipe: scene_count}}, max_steps: 2}}
grpo: {{data: {{recipe: scene_count}}, max_steps: 2{grpo}}}
eval: {{splits: [test], size: 4}}
{extra}"""


def nested_aliases(levels: int, width: int = 9) -> str:
    """YAML of a few hundred bytes whose aliases expand to width ** levels values."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"
