"""How many characters a token can stand for: a text longer than N times that takes more than N tokens, so a check
whose answer is "more than N tokens" need read no further (the reward audit, the prompt-length pre-check)."""

from __future__ import annotations

import weakref
from typing import Any

UNKNOWN_TOKEN_CHARS = 64  # a tokenizer without a vocabulary to measure: the most characters one token is taken to hold
_MEASURED: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # a large vocabulary: measured once


def longest_token_chars(tokenizer) -> int:
    """The most characters one token stands for (its vocabulary spelling is at least as long as what it decodes to)."""
    try:
        return _MEASURED[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else None
    longest = max(1, max((len(str(t)) for t in vocab), default=1)) if vocab else UNKNOWN_TOKEN_CHARS
    try:
        _MEASURED[tokenizer] = longest
    except TypeError:  # neither hashable nor weakly referenced: measured each time
        pass
    return longest


def prompt_chars(prompt: list[dict[str, Any]]) -> int:
    """The characters of a prompt's text parts, counted without joining them."""
    total = 0
    for message in prompt:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total
