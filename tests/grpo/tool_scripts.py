"""Making a random tiny twin call tools: its first turn in each rollout is forced to a scripted text.

The twins have random weights and would never write a tool call. `script_first_turns` wraps the model's `generate`
with a logits processor that, on first turns only (no tool turn in the input yet), makes the scripted tokens the
only ones allowed; everything else (the real generate, the cache, the tool loop, later turns) runs as it is. The
log-probs the update trains on are the model's own, so the step is a real GRPO step over the forced tokens.
"""

from __future__ import annotations

import json
from typing import Callable

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from vlm_grpo.grpo.tools.chat_format import RESULT_OPEN


def call_text(name: str, **arguments) -> str:
    """A call in the default format."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class _Force(LogitsProcessor):
    def __init__(self, scripts: list[list[int]], start: int):
        self.scripts, self.start = scripts, start

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.start
        for row, script in enumerate(self.scripts):
            if step < len(script):
                scores[row] = torch.finfo(scores.dtype).min
                scores[row, script[step]] = 0.0
        return scores


def script_first_turns(adapter, script: Callable[[int], str | None], later: Callable[[int], str | None] | None = None):
    """From now on, row r of a first turn writes `script(r)` then its end-of-turn token (None: sampled freely);
    `later(r)` does the same for the turns after a tool turn. Returns a function that undoes it."""
    model, tokenizer = adapter.model, adapter.tokenizer
    original = model.generate
    eos = adapter.eos_token_ids[0]

    def generate(*args, **kwargs):
        ids = kwargs["input_ids"]
        first = RESULT_OPEN not in tokenizer.decode(ids[0])  # no tool turn in the input yet
        chooser = script if first else later
        if chooser is not None:
            texts = [chooser(r) for r in range(ids.shape[0])]
            scripts = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] if t is not None else []
                       for t in texts]
            kwargs["logits_processor"] = LogitsProcessorList([_Force(scripts, ids.shape[1])])
        return original(*args, **kwargs)

    model.generate = generate
    return lambda: setattr(model, "generate", original)


# ---------------------------------------------------------------- shared cases
FAST_FAMILIES = ("qwen2_5_vl", "gemma3", "idefics3")  # M-RoPE, two-way image attention, tiles padded per sample


def every_family(fast=FAST_FAMILIES):
    """Every registered family; those outside `fast` only under `pytest -m tools_matrix`."""
    import pytest

    from vlm_grpo.adapters.registry import image_families

    return [pytest.param(f, marks=() if f in fast else pytest.mark.tools_matrix) for f in sorted(image_families())]


class CropEnvironment:
    """A TRL-style environment over the sample's image: `crop` returns a region, enlarged to 56 x 56."""

    def reset(self, images, **kwargs):
        self.image = images[0]

    def crop(self, x: int, y: int, width: int, height: int):
        """Crop a region of the image and return it enlarged.

        Args:
            x: left edge in pixels
            y: top edge in pixels
            width: width in pixels
            height: height in pixels
        """
        return self.image.crop((x, y, x + width, y + height)).resize((56, 56))


def picture(seed: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (112, 112), "white")
    ImageDraw.Draw(img).rectangle([10 + seed * 7, 20, 40 + seed * 5, 60], fill=(200, 30 * seed, 40))
    return img


def scripted_rollout(adapter, first, later=None, *, tools=(), environment=CropEnvironment, samples=None,
                     num_generations: int = 2, max_new_tokens: int = 200, **options):
    """A multi-turn rollout of 2 picture samples whose turns are scripted (see `script_first_turns`):
    (session, chat format, encoded prompts, Rollout)."""
    from types import SimpleNamespace

    from vlm_grpo.grpo.rollout.generation import encode
    from vlm_grpo.grpo.rollout.turns import ToolRollout
    from vlm_grpo.grpo.tools.chat_format import ChatFormat
    from vlm_grpo.grpo.tools.toolset import Toolset
    from vlm_grpo.recipes.base import Sample, user_turn

    samples = samples or [Sample(user_turn("What is in the box?"), [picture(i)], {}) for i in range(2)]
    fmt = ChatFormat(adapter)
    session = Toolset(tools, environment, timeout=options.pop("timeout", None)).start(samples, num_generations).format(fmt)
    prompts = encode(adapter, samples, "cpu", session)
    gen = SimpleNamespace(max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, min_new_tokens=0,
                          sampler="inverse_cdf")
    undo = script_first_turns(adapter, first, later)
    try:
        torch.manual_seed(0)
        ro = ToolRollout(adapter, session, fmt, gen, "cpu", **options).run(samples, num_generations, prompts)
    finally:
        undo()
    return session, fmt, prompts, ro
