"""A sequence-classification model as a reward, as TRL's `reward_funcs` takes one (a model id or a loaded model).

The score of a completion is the model's first logit for the prompt followed by the completion, TRL's rule:
chat-message prompts and completions are joined and written with the reward tokenizer's own chat template, plain
text is concatenated; the batch is padded on the right without special tokens added (the template has them).
The reward model reads text: image parts of a prompt are left out.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from vlm_grpo.grpo.setting_fields import ArgumentTypeError


def text_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Chat messages with string contents: text parts joined, image parts left out (the reward model reads text)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
        out.append({"role": message["role"], "content": content or ""})
    return out


def _plain(messages: Sequence[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


def scored_text(prompt: Any, completion: Any, tokenizer) -> str:
    """What the reward model reads for one completion: prompt + completion (chat template for chat messages)."""
    if isinstance(prompt, list) or isinstance(completion, list):
        prompt_msgs = text_messages(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        reply = text_messages(completion) if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        messages = prompt_msgs + reply
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False)
        return _plain(messages)
    return str(prompt) + str(completion)


class RewardModel:
    """`RewardModel("org/reward-model")` (a path, hub id or loaded `*ForSequenceClassification` model) is a reward
    function: `fn(prompts=..., completions=...) -> [score, ...]`, the first logit of each prompt + completion."""

    def __init__(self, model: Any, tokenizer: Any = None, *, name: str | None = None, device: Any = None,
                 batch_size: int = 8, max_length: int | None = None, trust_remote_code: bool = False,
                 allow_pickle_weights: bool = False):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model = os.fspath(model) if isinstance(model, os.PathLike) else model
        if not (isinstance(model, str) and model.strip()) and (isinstance(model, type) or not hasattr(model, "config")):
            raise ArgumentTypeError(f"RewardModel model: got {model!r:.80}; it takes a model id or path, or a loaded "
                            "sequence-classification model")
        if isinstance(model, str) and os.path.isabs(model) and not os.path.exists(model):  # not a hub id either
            raise ValueError(f"RewardModel model: no such folder: {model}")
        self.source = model if isinstance(model, str) else getattr(model, "name_or_path", "") or type(model).__name__
        if isinstance(model, str):
            from vlm_grpo.adapters.remote_code import check_remote_code

            check_remote_code(model, trust_remote_code, what="reward model")
            kwargs = {"trust_remote_code": trust_remote_code}
            if not allow_pickle_weights:
                kwargs["use_safetensors"] = True  # pickled weights can run code when read
            model = AutoModelForSequenceClassification.from_pretrained(model, **kwargs)
        if tokenizer is None:
            if not getattr(model, "name_or_path", ""):
                raise ValueError(f"reward model {self.source}: give its tokenizer (reward_processing_classes)")
            tokenizer = AutoTokenizer.from_pretrained(model.name_or_path, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token_id is None:  # as TRL: padding needs an id, and the model must find each row's last token
            tokenizer.pad_token = tokenizer.eos_token
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
        self.model = model.eval().requires_grad_(False)
        if device is not None:
            self.model.to(device)
        self.tokenizer = tokenizer
        self.batch_size, self.max_length = batch_size, max_length
        self.__name__ = name or "reward_model"

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **_: Any) -> list[float]:
        texts = [scored_text(p, c, self.tokenizer) for p, c in zip(prompts, completions)]
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(texts[start:start + self.batch_size], return_tensors="pt", padding=True,
                                   padding_side="right", add_special_tokens=False,
                                   truncation=self.max_length is not None, max_length=self.max_length)
            logits = self.model(**batch.to(device)).logits
            scores.extend(logits[:, 0].float().tolist())
        return scores
