"""Rollout: encode B prompts once, sample G completions each, mask everything after the first EOS.

By default (`shared_prefix`) each prompt's images are encoded once and its prompt prefilled once; the G
completions are sampled from that shared KV cache (`adapters.sharing.generate_shared`). Greedy decoding gives
the same tokens as the plain path, which repeats every prompt G times before generating.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vlm_grpo.adapters.batch import ImageTokenMismatch, PromptBatch
from vlm_grpo.adapters.completion_images import CompletionImages
from vlm_grpo.adapters.features import ImageFeatures
from vlm_grpo.adapters.prompt_cache import PromptCache
from vlm_grpo.adapters.sharing import generate_shared
from vlm_grpo.recipes.base import Sample


@dataclass
class Rollout:
    prompts: PromptBatch  # B prompts, encoded once
    completion_ids: torch.Tensor  # [B*G, T]
    completion_mask: torch.Tensor  # [B*G, T], 1 up to and including the first EOS
    truncated: torch.Tensor  # [B*G] bool: no EOS (cut at max_new_tokens)
    completions: list[str]
    prompt_texts: list[str]  # B
    num_generations: int = 1
    features: ImageFeatures | None = None  # the prompts' image features (detached), when the rollout computed them
    stats: dict[str, int] = field(default_factory=dict)  # prefill_tokens, decode_tokens
    # multi-turn rollouts with tools (rollout/turns.py); None / empty for one turn
    tool_mask: torch.Tensor | None = None  # [B*G, T] 1 at the model's own tokens, 0 at tool turns' (and padding)
    completion_images: CompletionImages | None = None  # images the tools returned, each encoded once
    conversations: list[list[dict]] | None = None  # [B*G] the messages after the prompt, as TRL hands them on
    tool_metrics: dict[str, float] = field(default_factory=dict)
    turn_features: ImageFeatures | None = None  # the tool images' features as encoded (with gradient: encode once)
    sampling_logps: torch.Tensor | None = None  # [B*G, T] the sampling engine's own log-probs (vLLM's); None: the policy sampled
    extra_fields: dict[str, list] = field(default_factory=dict)  # a rollout_func's columns for the rewards, per row

    def prompt_index(self, rows: list[int]) -> list[int]:
        """The prompt each completion row belongs to."""
        return [r // self.num_generations for r in rows]


def mask_after_eos(completion_ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 for tokens up to and including the first EOS of each row, 0 after it."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    seen_before = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~seen_before).long()


def check_no_placeholders(adapter, completion_ids: torch.Tensor, mask: torch.Tensor, num_generations: int) -> None:
    """A generated image placeholder would shift image features onto text: never train on it."""
    bad = (completion_ids == adapter.image_token_id) & mask.bool()
    if bad.any():
        row = int(bad.any(dim=1).nonzero()[0])
        raise ImageTokenMismatch(
            f"sample {row // num_generations}, completion {row % num_generations}: generated the image placeholder "
            f"id {adapter.image_token_id}; it must be suppressed (adapter.suppressed_token_ids)"
        )


def encode(adapter, samples: list[Sample], device, session=None, cache: PromptCache | None = None) -> PromptBatch:
    """The samples' prompts, tokenized with their images and videos, on `device` in the model's dtype; with a tool
    `session` (rollout/turns.py), its prompts and each sample's tools as the chat format describes them. `cache`:
    rows encoded in earlier steps are taken from it (adapters/prompt_cache.py)."""
    videos = [s.videos for s in samples]
    if session is not None:
        prompts = adapter.encode_prompts(session.conversations, session.images, videos, tools=session.template_tools,
                                         cache=cache)
        return prompts.to(device, dtype=next(adapter.model.parameters()).dtype)
    prompts = adapter.encode_prompts([s.prompt for s in samples], [s.images for s in samples], videos, cache=cache)
    return prompts.to(device, dtype=next(adapter.model.parameters()).dtype)


def sampling_settings(gen, use_cache: bool | None, max_new_tokens: int, min_new_tokens: int = 0) -> dict:
    """generate()'s sampling arguments from the generation section (the budget is the caller's: a later tool turn
    has only what is left)."""
    return dict(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=True,
                temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k, use_cache=use_cache,
                sampler=gen.sampler)


def rollout(
    adapter, samples: list[Sample], gen, num_generations: int, device, use_cache: bool | None = None, shared_prefix: bool = True,
    prompts: PromptBatch | None = None, features: ImageFeatures | None = None, token_logps=None,
) -> Rollout:
    """`prompts`: the samples already encoded (`encode`); `features`: their image features, already computed
    (the shared-prefix path then runs no encoder); `token_logps` (adapters.sampler.TokenLogps): gets the sampled
    tokens' log-probs where the inverse-CDF sampler draws them."""
    prompts = encode(adapter, samples, device) if prompts is None else prompts
    sampling = sampling_settings(gen, use_cache, gen.max_new_tokens, gen.min_new_tokens)
    if token_logps is not None:
        sampling["token_logps"] = token_logps
    if (getattr(adapter.model.generation_config, "num_beams", 1) or 1) > 1:
        # beam-search sampling (generation_kwargs num_beams) keeps num_beams rows per completion: each completion
        # runs its own generate(), with generate()'s own draw, as TRL's does
        shared_prefix, sampling["sampler"] = False, "multinomial"
    if shared_prefix:
        result = generate_shared(adapter, prompts, num_generations, features=features, **sampling)
        out, features, prefill = result.output, result.features, result.prefill_tokens
    else:
        grouped = prompts.repeat(num_generations)
        out = adapter.generate(grouped, **sampling)
        prefill = int(grouped.attention_mask.sum())
    completion_ids = out.sequences[:, prompts.input_ids.shape[1] :]
    mask = mask_after_eos(completion_ids, adapter.eos_token_ids)
    check_no_placeholders(adapter, completion_ids, mask, num_generations)
    texts = adapter.tokenizer.batch_decode(completion_ids * mask + adapter.pad_token_id * (1 - mask), skip_special_tokens=True)
    return Rollout(
        prompts=prompts,
        completion_ids=completion_ids,
        completion_mask=mask,
        truncated=~torch.isin(completion_ids, torch.tensor(adapter.eos_token_ids, device=completion_ids.device)).any(1),
        completions=texts,
        prompt_texts=[adapter.tokenizer.decode(ids, skip_special_tokens=True) for ids in prompts.input_ids],
        num_generations=num_generations,
        features=features,
        stats={"prefill_tokens": prefill, "decode_tokens": int(completion_ids.numel())},
    )
