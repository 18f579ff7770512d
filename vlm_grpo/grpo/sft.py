"""Supervised warm-up (SFT) on a recipe's reference responses, before GRPO.

GRPO's reward is sparse while the policy cannot yet read images; a short supervised stage on reference
answers gives it the format and a first grip on the task (the "LLM learns to see" recipe: SFT, then GRPO).

Only completion tokens are learned: the prompt is encoded by the adapter exactly as a rollout encodes it,
the reference is the assistant turn of the family's own chat template (ending with its end-of-turn /
EOS token), and the forward goes through `adapter.completion_inputs`, so each family's extra inputs
(M-RoPE token types, pixel masks, tiles) are the ones the GRPO forward uses. Prompt, image and padding
positions carry no loss (label -100); the loss is the mean negative log-likelihood over completion tokens.

With `sft.eval_every N` the policy is evaluated greedily on the held-out split every N steps and at the
end (`eval/accuracy` etc. in metrics.jsonl: the training curve of a shipped checkpoint).

The step is grpo/parts/supervised_update.py's; everything else (run dir, freeze/LoRA, per-module learning rates,
checkpoints, resume, final model) is the trainer's parts, shared with GRPO (grpo/loop/stage.py), so `final/` loads with
`vlm-grpo train --init-from PATH`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.grpo.logprobs.lm_head import score_completions
from vlm_grpo.recipes.base import Sample

log = logging.getLogger(__name__)
IGNORE_INDEX = -100  # the label of a position that carries no loss (transformers' convention)


@dataclass
class SFTBatch:
    """Prompts encoded once (left-padded) + reference completions (right-padded) and their mask."""

    prompts: PromptBatch
    completion_ids: torch.Tensor  # [B, T], pad id after each reference
    completion_mask: torch.Tensor  # [B, T], 1 on reference tokens (end-of-turn included)

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, rows: Sequence[int]) -> "SFTBatch":
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.completion_ids.device)
        return SFTBatch(self.prompts.select(rows), self.completion_ids[idx], self.completion_mask[idx])

    def to(self, device, dtype: torch.dtype | None = None) -> "SFTBatch":
        return replace(
            self,
            prompts=self.prompts.to(device, dtype=dtype),
            completion_ids=self.completion_ids.to(device),
            completion_mask=self.completion_mask.to(device),
        )

    def model_inputs(self, adapter) -> dict[str, torch.Tensor]:
        """The teacher-forced forward's kwargs over prompt + reference (the adapter's own extension)."""
        return adapter.completion_inputs(self.prompts, self.completion_ids, self.completion_mask)

    def labels(self) -> torch.Tensor:
        """[B, L+T] labels aligned with `model_inputs()['input_ids']`: the reference tokens, -100 elsewhere."""
        prompt = torch.full_like(self.prompts.input_ids, IGNORE_INDEX)
        completion = self.completion_ids.masked_fill(self.completion_mask == 0, IGNORE_INDEX)
        return torch.cat([prompt, completion], dim=1)


def reference_token_ids(adapter, sample: Sample, max_tokens: int | None = None) -> list[int]:
    """The reference as the family's chat template writes an assistant turn after this prompt, ending
    with the first EOS id the policy stops at (appended when the template has none)."""
    if sample.reference is None:
        raise ValueError("SFT needs reference responses, and this recipe's samples have none (Sample.reference)")
    processor = adapter.processor
    prompt_text = processor.apply_chat_template(list(sample.prompt), add_generation_prompt=True, tokenize=False)
    reply = {"role": "assistant", "content": [{"type": "text", "text": sample.reference}]}
    full_text = processor.apply_chat_template([*sample.prompt, reply], tokenize=False)
    tail = full_text[len(prompt_text):] if full_text.startswith(prompt_text) else sample.reference
    ids = adapter.tokenizer(tail, add_special_tokens=False)["input_ids"]
    eos = set(adapter.eos_token_ids)
    end = next((i for i, t in enumerate(ids) if t in eos), None)
    ids = ids[: end + 1] if end is not None else ids + [adapter.eos_token_ids[0]]
    if max_tokens is not None and len(ids) > max_tokens:
        warnings.warn(f"a reference of {len(ids)} tokens is cut to sft.max_reference_tokens={max_tokens}", stacklevel=2)
        ids = ids[:max_tokens]
    forbidden = set(adapter.suppressed_token_ids())
    if forbidden & set(ids):
        raise ValueError("a reference response contains an image placeholder token; it cannot be a completion")
    return ids


def build_sft_batch(adapter, samples: Sequence[Sample], max_tokens: int | None = None) -> SFTBatch:
    """Encode the prompts with `adapter.encode_prompts` and append each reference, right-padded."""
    prompts = adapter.encode_prompts([s.prompt for s in samples], [s.images for s in samples],
                                   [s.videos for s in samples])
    refs = [reference_token_ids(adapter, s, max_tokens) for s in samples]
    width = max(len(r) for r in refs)
    ids = torch.full((len(refs), width), adapter.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(refs), width), dtype=torch.long)
    for row, ref in enumerate(refs):
        ids[row, : len(ref)] = torch.tensor(ref, dtype=torch.long)
        mask[row, : len(ref)] = 1
    return SFTBatch(prompts, ids, mask)


def completion_nll(adapter, batch: SFTBatch, model=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed NLL over completion tokens, their count, and how many the argmax predicts right."""
    scores = score_completions(adapter, batch.prompts, batch.completion_ids, batch.completion_mask, model=model)
    mask = batch.completion_mask.float()
    hits = (scores.hits.float() * mask).sum()
    return (-scores.logps * mask).sum(), mask.sum(), hits


def sft_loss(adapter, batch: SFTBatch, model=None) -> torch.Tensor:
    """Mean NLL over the batch's completion tokens."""
    total, tokens, _ = completion_nll(adapter, batch, model=model)
    return total / tokens.clamp(min=1)
