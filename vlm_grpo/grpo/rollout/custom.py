"""TRL's `rollout_func`: the user's own generation in place of the policy's sampling.

As TRL calls it: `rollout_func(prompts, trainer)` with the process's prompts, each repeated num_generations times in a
row (TRL's sampler hands them so), returns a dict with `prompt_ids`, `completion_ids` (one list of token ids per
prompt entry) and `logprobs`; any other key is a column handed to the rewards (a list: one value per completion,
anything else: the same value for all), and `env_mask` marks the model's own tokens (1) against inserted ones (0).
The training forward runs on this project's own encoding of each prompt (its images included), followed by the
returned completion tokens; the sampling log-probs are not used (the old log-probs are recomputed on the policy).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.grpo.rollout.generation import Rollout, mask_after_eos

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


def _padded(rows: list[list[int]], pad: int, device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0) or 1
    out = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long, device=device)
    return out


def checked_output(output: Any) -> dict:
    """A rollout_func's result, refused in one line unless it is a dict with the keys TRL requires."""
    if not isinstance(output, dict):
        raise ValueError(f"rollout_func must return a dict with {', '.join(REQUIRED)}; got {type(output).__name__}")
    missing = [k for k in REQUIRED if k not in output]
    if missing:
        raise ValueError(f"rollout_func must return keys {missing} in its output dict")
    return output


def custom_rollout(rollout_func: Callable, trainer: Any, adapter, samples, prompts: PromptBatch,
                   num_generations: int) -> Rollout:
    entries = [s.data_prompt if s.data_prompt is not None else s.prompt for s in samples for _ in range(num_generations)]
    output = checked_output(rollout_func(entries, trainer))
    completion_ids = [list(map(int, ids)) for ids in output["completion_ids"]]
    if len(completion_ids) != len(entries):
        raise ValueError(f"rollout_func returned {len(completion_ids)} completions for {len(entries)} prompt entries "
                         f"({len(samples)} prompts x num_generations {num_generations}): one per entry")
    device = prompts.input_ids.device
    ids = _padded(completion_ids, adapter.pad_token_id, device)
    lengths = torch.tensor([len(r) for r in completion_ids], device=device)
    present = (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
    mask = mask_after_eos(ids, adapter.eos_token_ids) * present
    extra = {k: v for k, v in output.items() if k not in REQUIRED}
    env_mask = extra.pop("env_mask", None)
    tool_mask = None if env_mask is None else _padded([list(m) for m in env_mask], 0, device) * mask
    columns = {k: list(v) if isinstance(v, (list, tuple)) else [v] * len(entries) for k, v in extra.items()}
    texts = adapter.tokenizer.batch_decode(ids * mask + adapter.pad_token_id * (1 - mask), skip_special_tokens=True)
    eos = torch.tensor(adapter.eos_token_ids, device=device)
    return Rollout(
        prompts=prompts, completion_ids=ids, completion_mask=mask,
        truncated=~(torch.isin(ids, eos) & present.bool()).any(1), completions=texts,
        prompt_texts=[adapter.tokenizer.decode(p, skip_special_tokens=True) for p in prompts.input_ids],
        num_generations=num_generations, stats={"prefill_tokens": 0, "decode_tokens": int(lengths.sum())},
        tool_mask=tool_mask, extra_fields=columns,
    )
