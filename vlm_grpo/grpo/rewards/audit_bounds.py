"""What the reward audit may cost, whatever the dataset holds: how many rows it scores, how many characters of each
text it reads or tokenizes, and how each adversary is built to fit the completion budget (grpo/rewards/audit.py).

A text longer than the budget times the longest token's characters takes more tokens than the budget, so nothing
past that many characters can reach a completion: every text is cut there before it is tokenized or built on.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Callable

from vlm_grpo.grpo.data.token_chars import longest_token_chars
from vlm_grpo.recipes.base import Sample

AUDIT_ROWS = 8  # rows the audit at the start of a run scores
MAX_AUDIT_ROWS = 64  # the most rows any audit scores (`vlm-grpo audit-rewards --samples`)
MAX_LISTED = 32  # the most candidate answers an enumeration lists
NO_BUDGET_CHARS = 4096  # characters read per text when no tokenizer gives the completion budget


def audit_rows(size: int, seed: int, count: int = AUDIT_ROWS) -> list[int]:
    """At most `count` row indices of a split of `size` rows, drawn by the run's seed (the same rows every run)."""
    return sorted(random.Random(f"reward-audit:{seed}").sample(range(size), min(count, size)))


class CompletionCut:
    """text -> (text as a run would hold it, token ids): cut at `limit` tokens, else ended by end-of-sequence.
    Reads at most `max_chars` characters of a text: more would take more than `limit` tokens."""

    def __init__(self, tokenizer, eos_id: int | None, limit: int):
        self.tokenizer, self.eos_id, self.limit = tokenizer, eos_id, limit
        self.max_chars = limit * longest_token_chars(tokenizer)

    def __call__(self, text: str) -> tuple[str, list[int]]:
        return self._cut(text)[:2]

    def fits(self, text: str) -> bool:
        """`text` reaches the rewards whole and ended by end-of-sequence, as a completion that stopped in time."""
        return len(text) <= self.max_chars and not self._cut(text)[2]

    def _cut(self, text: str) -> tuple[str, list[int], bool]:
        longer = len(text) > self.max_chars
        ids = list(self.tokenizer(text[: self.max_chars], add_special_tokens=False)["input_ids"])
        if longer or len(ids) >= self.limit:
            ids = ids[: self.limit]
            return self.tokenizer.decode(ids), ids, True
        return text, ids + ([self.eos_id] if self.eos_id is not None else []), False


def text_fits(encode: Callable[[str], tuple[str, list[int]]] | None) -> tuple[Callable[[str], bool], int]:
    """(does a text reach the rewards whole, the characters read per text) for the audit's `encode`."""
    if isinstance(encode, CompletionCut):
        return encode.fits, encode.max_chars
    if encode is None:
        return (lambda text: len(text) <= NO_BUDGET_CHARS), NO_BUDGET_CHARS
    return (lambda text: len(text) <= NO_BUDGET_CHARS and encode(text)[0] == text), NO_BUDGET_CHARS


def _clip(value: Any, chars: int) -> Any:
    # one character over the bound: a clipped text never fits, so nothing is built on a part of an answer
    if isinstance(value, str):
        return value[: chars + 1]
    if type(value) in (list, tuple):
        return type(value)(_clip(v, chars) for v in value[: chars + 1])
    return value


def _clip_message(message: dict, chars: int) -> dict:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": content[: chars + 1]}
    if isinstance(content, list):
        parts = [{**p, "text": _clip(p["text"], chars)} if isinstance(p, dict) and isinstance(p.get("text"), str)
                 else p for p in content[: chars + 1]]
        return {**message, "content": parts}
    return message


def clipped_sample(sample: Sample, chars: int) -> Sample:
    """`sample` as the audit reads it: each prompt text, field text (and list of texts) and the reference cut to
    `chars` + 1 characters, so an answer, question or reference longer than any completion is never read whole."""
    return replace(sample, prompt=[_clip_message(m, chars) for m in sample.prompt],
                   fields={k: _clip(v, chars) for k, v in sample.fields.items()},
                   reference=_clip(sample.reference, chars))


def longest_fitting(build: Callable[[int], str], most: int, fits: Callable[[str], bool],
                    least: int = 1) -> tuple[int, str] | None:
    """(n, `build(n)`) for the largest n in least..most whose text fits (texts grow with n); None when none does."""
    if most < least or not fits(build(least)):
        return None
    low, high = least, most
    while low < high:  # bisection: a few tokenizations, however long the text could grow
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(build(middle)) else (low, middle - 1)
    return low, build(low)


def first_fitting(texts, fits: Callable[[str], bool]) -> str | None:
    return next((t for t in texts if t is not None and fits(t)), None)


def bounded_answer(answer_of: Callable[[Sample], str | None], sample: Sample, chars: int) -> tuple[str | None, bool]:
    """(the row's right answer read from its clipped texts, whether it was too long to read): an answer that
    changes when twice as much of each text is read runs past the bound, so no completion can state it whole."""
    answer = answer_of(clipped_sample(sample, chars))
    if answer is None or answer == answer_of(clipped_sample(sample, 2 * chars + 1)):
        return answer, False
    return None, True
