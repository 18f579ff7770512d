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
        first = RESULT_OPEN not in tokenizer.decode(ids[0]) and "tool_response" not in tokenizer.decode(ids[0])
        chooser = script if first else later
        if chooser is not None:
            texts = [chooser(r) for r in range(ids.shape[0])]
            scripts = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] if t is not None else []
                       for t in texts]
            kwargs["logits_processor"] = LogitsProcessorList([_Force(scripts, ids.shape[1])])
        return original(*args, **kwargs)

    model.generate = generate
    return lambda: setattr(model, "generate", original)
