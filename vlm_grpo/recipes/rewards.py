"""Small helpers the recipes' reward functions share: tag extraction, edit distance, text normalization."""

from __future__ import annotations

import re

_WS = re.compile(r"\s+")


def tag_content(text: str, tag: str, last: bool = True) -> str | None:
    """The text between `<tag>` and `</tag>` (the last such pair by default), or None when there is none."""
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    if not matches:
        return None
    return matches[-1] if last else matches[0]


def tags_filled(text: str, *tags: str) -> bool:
    """Whether each tag's (last) block holds something besides whitespace: a format reward that checks only the
    tags pays `<think></think><answer></answer>`, or a reply that echoes the instructions naming the tags."""
    return all((tag_content(text, tag) or "").strip() for tag in tags)


def answer_or_text(text: str) -> str:
    """The `<answer>` content when there is one, else the whole text; stripped either way."""
    inner = tag_content(text, "answer")
    return (inner if inner is not None else text).strip()


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit-cost insert, delete, substitute), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def similarity(a: str, b: str) -> float:
    """1 - edit_distance / max(len(a), len(b)): 1.0 for equal strings, 0.0 for nothing in common
    (two empty strings count as equal)."""
    longest = max(len(a), len(b))
    return 1.0 if longest == 0 else 1.0 - edit_distance(a, b) / longest


def squash_spaces(text: str) -> str:
    """Lower-case, trimmed, every run of whitespace one space."""
    return _WS.sub(" ", text).strip().lower()


def normalize_answer(text: str) -> str:
    """For plain-string answer matching: lower-case, whitespace squashed, surrounding `$` and `\\boxed{}`
    and a trailing full stop removed."""
    text = squash_spaces(text)
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text)
    if boxed:
        text = boxed.group(1).strip()
    text = text.strip("$").strip()
    return text[:-1].rstrip() if text.endswith(".") else text
