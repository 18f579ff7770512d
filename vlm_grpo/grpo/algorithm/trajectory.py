"""The trajectory record: one GRPO step's experience, built once and read by every update of the step.

Rows are group-contiguous: prompt i's G completions are rows i*G .. i*G+G-1 (N = B*G rows, T = the longest
completion). A multi-turn rollout with tools (rollout/turns.py) makes a completion the model's turns and the tool
turns between them: `tool_mask` says which tokens are the model's own (the only ones `loss_mask` keeps, so tool
results are in no loss, ratio or KL term) and `completion_images` carries the images the tools returned. The record carries what the updates need and nothing they would have to recompute: the encoded
prompts, the sampled tokens and which of them train, the rewards and advantages, the sampling policy's and the
reference's log-probs, and the prompts' image features when they stay valid for the whole step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vlm_grpo.adapters.batch import PromptBatch
from vlm_grpo.adapters.completion_images import CompletionImages
from vlm_grpo.adapters.features import ImageFeatures


def model_tokens(completion_mask: torch.Tensor, tool_mask: torch.Tensor | None) -> torch.Tensor:
    """[N, T] 1 at the completion tokens the model generated: a tool turn's tokens are the tool's (tool_mask 0)."""
    return completion_mask if tool_mask is None else completion_mask * tool_mask


@dataclass
class Trajectory:
    prompts: PromptBatch  # the B prompts, encoded once (tokens, image tensors)
    sample_indices: list[int]  # [B] each prompt's index in the training split
    prompt_texts: list[str]  # [B]
    completions: list[str]  # [N] decoded completions
    completion_ids: torch.Tensor  # [N, T] sampled tokens (pad after the first EOS)
    completion_mask: torch.Tensor  # [N, T] 1 up to and including the first EOS
    loss_mask: torch.Tensor  # [N, T] the tokens that train: completion_mask x tool_mask, less what the loss drops
    rewards: torch.Tensor  # [N] the weighted total (NaN: no reward applies)
    reward_components: dict[str, torch.Tensor]  # name -> [N] each reward's raw score (NaN: not applicable)
    advantages: torch.Tensor  # [N] one per completion, or [N, T] one per token
    num_generations: int  # G
    old_logps: torch.Tensor | None = None  # [N, T] under the sampling policy; None: on-policy (the update's own)
    ref_logps: torch.Tensor | None = None  # [N, T] under the reference policy; None: no KL term (beta 0)
    features: ImageFeatures | None = None  # the prompts' image features, detached, when reusable all step
    policy_features: ImageFeatures | None = None  # the policy's own, with gradient, for a single update (encode once)
    extra: dict[str, list] = field(default_factory=dict)  # columns rewards logged (log_extra), one value per row
    stats: dict[str, int] = field(default_factory=dict)  # rollout cost: prefill_tokens, decode_tokens
    tool_mask: torch.Tensor | None = None  # [N, T] 1 at the model's own tokens, 0 at tool turns'; None: one turn
    completion_images: CompletionImages | None = None  # images tool turns showed, per row (each encoded once)
    conversations: list[list[dict]] | None = None  # [N] the messages after the prompt (tool rollouts), TRL's form
    tool_metrics: dict[str, float] = field(default_factory=dict)  # calls, failures, turns, images per completion
    sampling_logps: torch.Tensor | None = None  # [N, T] the sampling engine's own log-probs (vLLM); None: the policy's
    sampling_ratio: torch.Tensor | None = None  # [N, T] or [N, 1] the engine correction on the per-token loss

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def model_tokens(self) -> torch.Tensor:
        """[N, T] 1 at the tokens the model generated (all completion tokens unless tools answered in between)."""
        return model_tokens(self.completion_mask, self.tool_mask)

    def prompt_index(self, rows: list[int]) -> list[int]:
        """The prompt each completion row belongs to."""
        return [r // self.num_generations for r in rows]

    def micro_batches(self, steps: int) -> list[list[int]]:
        """The rows of each of `steps` micro-batches, whole prompt groups each."""
        groups = len(self) // self.num_generations
        if groups % steps:
            raise ValueError(f"gradient_accumulation_steps={steps} must divide the {groups} prompt groups of a step")
        per = groups // steps * self.num_generations
        return [list(range(c * per, (c + 1) * per)) for c in range(steps)]
