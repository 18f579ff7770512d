"""A VLM judge as a reward: a generative vision-language model is shown a completion's image(s), the question and
the answer given, and asked a question about it (default: is the answer correct?). The score is the judge's
answer, read off its first answer token: the probability it says yes rather than no,
P(yes) / (P(yes) + P(no)), summed over the spellings "yes", "Yes", " yes" ... (and the same for no).

The judge is any model `--model` loads (a checkpoint of a supported family, a tiny twin), frozen, on the run's
device. Its images are the completion's: the `images` (or `image`, or another image) column rewards receive, else
the images filled into a chat prompt's image parts; a completion without images is judged on text alone.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from vlm_grpo.grpo.setting_fields import ArgumentTypeError

DEFAULT_QUESTION = "Is the answer correct for the image and the question? Answer yes or no."
YES = ("yes", "Yes", "YES", " yes", " Yes")
NO = ("no", "No", "NO", " no", " No")


def answer_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The first token of each spelling of yes and of no; a first token both share (a lone space in a small
    vocabulary) says nothing and is left out, and each side must keep one, or the judge's answer cannot be read."""
    def first(words):
        return {tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in words}

    yes, no = first(YES), first(NO)
    yes, no = sorted(yes - no), sorted(no - yes)
    if not yes or not no:
        raise ValueError("VLM judge: its tokenizer starts 'yes' and 'no' with the same tokens; its answer cannot be read")
    return yes, no


def _text(value: Any) -> str:
    """A prompt's last user turn or a completion, as text (image parts left out)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[0], dict):
        turns = [m for m in value if m.get("role") == "user"] or value
        content = turns[-1].get("content")
        if isinstance(content, str):
            return content
        return " ".join(p.get("text") or "" for p in content or [] if isinstance(p, dict) and p.get("type") == "text")
    return str(value)


def _prompt_images(prompt: Any) -> list:
    """Images filled into a chat prompt's image parts (the `prompts` TRL hands a reward)."""
    if not isinstance(prompt, list):
        return []
    found = []
    for message in prompt:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            found += [p["image"] for p in content if isinstance(p, dict) and p.get("type") == "image" and p.get("image") is not None]
    return found


def _is_images(value: Any) -> bool:
    from PIL import Image

    items = value if isinstance(value, (list, tuple)) else [value]
    return bool(items) and all(isinstance(v, Image.Image) for v in items)


def completion_images(n: int, prompts: Sequence[Any], columns: dict[str, Sequence[Any]]) -> list[list]:
    """Each completion's images: the `images` column, else `image`, else another column of images (a renamed image
    column), else those filled into its chat prompt."""
    order = [k for k in ("images", "image") if k in columns] + sorted(k for k in columns if k not in ("images", "image"))
    out = []
    for i in range(n):
        value = next((columns[k][i] for k in order if _is_images(columns[k][i])), None)
        value = _prompt_images(prompts[i]) if value is None else value
        out.append(list(value) if isinstance(value, (list, tuple)) else [value])
    return out


class VLMJudge:
    """`VLMJudge("FAMILY:org/judge-model", question=...)` (a model spec or a loaded adapter) is a
    reward function: `fn(prompts=..., completions=..., images=...) -> [P(yes), ...]`."""

    def __init__(self, model: Any, question: str = DEFAULT_QUESTION, *, name: str = "judge", device: Any = None,
                 batch_size: int = 4, seed: int = 0, dtype: str = "auto", trust_remote_code: bool = False,
                 allow_pickle_weights: bool = False):
        model = os.fspath(model) if isinstance(model, os.PathLike) else model
        if not (isinstance(model, str) and model.strip()) and not hasattr(model, "encode_prompts"):
            raise ArgumentTypeError(f"VLMJudge model: got {model!r:.80}; it takes a model spec or path (as --model), or a "
                            "vlm_grpo adapter")
        if not isinstance(question, str) or not question.strip():
            raise ArgumentTypeError(f"VLMJudge question: got {question!r:.80}; it takes the yes/no question as text")
        if isinstance(model, str):
            from vlm_grpo.loader import load_model

            model = load_model(model, seed=seed, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                               allow_pickle_weights=allow_pickle_weights, decide_cache=False)
        elif device is not None:
            model.model.to(device)
        if not hasattr(model, "encode_prompts"):
            raise ValueError(f"VLM judge: expected a model spec or a vlm_grpo adapter, got {type(model).__name__}")
        self.adapter = model
        self.adapter.model.eval().requires_grad_(False)
        self.source = getattr(model, "source", "") or model.family
        self.question, self.batch_size = question, batch_size
        self.yes_ids, self.no_ids = answer_token_ids(model.tokenizer)
        self.__name__ = name

    def conversation(self, prompt: Any, completion: Any, n_images: int) -> list[dict[str, Any]]:
        """What the judge is asked about one completion (its images first, as a user turn)."""
        text = f"Question: {_text(prompt)}\nAnswer given: {_text(completion)}\n\n{self.question}"
        return [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}]

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        columns = {k: v for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == len(completions)}
        pictures = completion_images(len(completions), prompts, columns)
        param = next(self.adapter.model.parameters())
        scores: list[float] = []
        for start in range(0, len(completions), self.batch_size):
            rows = range(start, min(start + self.batch_size, len(completions)))
            convs = [self.conversation(prompts[i], completions[i], len(pictures[i])) for i in rows]
            batch = self.adapter.encode_prompts(convs, [pictures[i] for i in rows]).to(param.device, dtype=param.dtype)
            # prompts are left-padded: the last position is where the judge's answer starts
            logits = self.adapter.model(**self.adapter.model_inputs(batch), logits_to_keep=1).logits[:, -1]
            probs = logits.float().softmax(-1)
            yes, no = probs[:, self.yes_ids].sum(-1), probs[:, self.no_ids].sum(-1)
            scores.extend((yes / (yes + no)).tolist())
        return scores
