"""A small byte-level BPE tokenizer built offline, carrying a family's real special tokens.

Tiny twins cannot download the real tokenizer, but everything the loop touches (special
tokens as single ids, the chat template, left padding, eos/pad) must behave as the real one.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

_SUBJECTS = ["triangles", "circles", "squares", "shapes", "objects", "letters", "cats", "dogs", "cars", "numbers"]
_COLOURS = ["red", "blue", "green", "yellow", "black", "white"]
_TEMPLATES = [
    "How many {c} {s} are in the image?",
    "Count the {c} {s}. Answer with a number.",
    "<think>I see {n} {c} {s}.</think> <answer>{n}</answer>",
    "Is the following statement true: the {s} is left of the {c} box?",
    "Decode the message using the cipher in the image: {n} {s}",
    "There are {n} {s}. So the answer is {n}.",
    "Let me think step by step about the {c} {s} in the picture.",
    "The answer is True. The answer is False. Yes. No. {n}",
]


def _corpus() -> list[str]:
    lines = []
    for template, s, c, n in itertools.product(_TEMPLATES, _SUBJECTS, _COLOURS, range(10)):
        if (len(lines) * 7 + n) % 5 == 0:  # a deterministic subsample keeps training fast
            lines.append(template.format(s=s, c=c, n=n))
    lines.append("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 _ .,:;!?()[]{}<>/\\+-*=")
    return lines


@lru_cache(maxsize=None)
def _trained(vocab_size: int, special_tokens: tuple[str, ...]) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def build_tokenizer(
    special_tokens: list[str],
    *,
    chat_template: str,
    eos_token: str,
    pad_token: str,
    bos_token: str | None = None,
    extra_special_tokens: dict[str, str] | None = None,
    vocab_size: int = 700,
) -> PreTrainedTokenizerFast:
    """Deterministic tokenizer: every entry of `special_tokens` is one id, the first ones lowest."""
    backend = Tokenizer.from_str(_trained(vocab_size, tuple(special_tokens)))
    kwargs = dict(
        tokenizer_object=backend,
        eos_token=eos_token,
        pad_token=pad_token,
        padding_side="left",
        chat_template=chat_template,
    )
    if bos_token:
        kwargs["bos_token"] = bos_token
    if extra_special_tokens:
        kwargs["extra_special_tokens"] = extra_special_tokens
    tokenizer = PreTrainedTokenizerFast(**kwargs)
    for token in special_tokens:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise AssertionError(f"special token {token!r} did not stay a single token: {ids}")
    return tokenizer
