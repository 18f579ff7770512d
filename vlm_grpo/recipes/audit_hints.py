"""What the reward audit and the hacking monitors need to know about a task: a sample's right answer, the answers
the task allows, and the layout a finished completion takes. A recipe gives its own (`Recipe.audit`); a recipe
without them (your TRL-format rows) gets the R1 defaults below: the answer is the `solution` (or `answer`) column
with any `<answer>` tags stripped, and the layout is `<think>...</think>` then `<answer>...</answer>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from vlm_grpo.recipes.base import Sample
from vlm_grpo.recipes.rewards import answer_or_text, tag_content

ANSWER_COLUMNS = ("solution", "answer")  # where a row's right answer usually sits (TRL's name first)
TRUTH_PAIRS = ({"true", "false"}, {"yes", "no"})
LETTERS = ("A", "B", "C", "D", "E")
_SENTENCE_END = re.compile(r"[.!?](?:\s+|$)")
_EMPTY_THINK = re.compile(r"<think>\s*</think>\s*")


def r1_layout(sample: Sample, reasoning: str, answer: str) -> str:
    """The R1 layout every think/answer reward accepts: tags on their own lines."""
    return f"<think>\n{reasoning}\n</think>\n<answer>\n{answer}\n</answer>"


def inline_think_layout(sample: Sample, reasoning: str, answer: str) -> str:
    """`<think>` and `<answer>` each on one line (the format of the recipes whose rewards read tags inline)."""
    return f"<think>{reasoning}</think>\n<answer>{answer}</answer>"


def column_answer(sample: Sample) -> str | None:
    """The first answer column present, its `<answer>` content when tagged."""
    for name in ANSWER_COLUMNS:
        value = sample.fields.get(name)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return answer_or_text(str(value))
    return None


def generic_candidates(answer: str) -> list[str]:
    """Answers a task with this right answer plausibly allows: both truth values, the option letters, a range of
    small counts, or the integers around a larger one. Empty when nothing can be guessed (free text)."""
    word = answer.strip().strip(".").lower()
    for pair in TRUTH_PAIRS:
        if word in pair:
            return [w.capitalize() for w in sorted(pair, reverse=True)]
    if answer.strip() in LETTERS:
        return list(LETTERS)
    if re.fullmatch(r"-?\d+", answer.strip()):
        n, width = int(answer), len(answer.strip())  # "042": a code of three digits, its neighbours as wide
        if 0 <= n <= 9 and width == 1:
            return [str(k) for k in range(0, 10)]
        return [str(k).zfill(width) if k >= 0 else str(k) for k in range(n - 2, n + 3)]
    return []


def last_sentence(text: str) -> str:
    """Where a plain-text answer sits: the last sentence (the whole text when it has one)."""
    parts = [p for p in _SENTENCE_END.split(text.strip()) if p.strip()]
    return parts[-1] if parts else text


def answer_span(text: str) -> str:
    """The `<answer>` content of a completion, else its last sentence."""
    inner = tag_content(text, "answer")
    return inner if inner is not None else last_sentence(text)


@dataclass(frozen=True)
class AuditHints:
    answer: Callable[[Sample], str | None] = column_answer  # the right answer, bare ("3", "True", "i can see")
    layout: Callable[[Sample, str, str], str] = r1_layout  # (sample, reasoning, answer) -> a completion in the form
    candidates: Callable[[Sample, str], list[str]] = lambda sample, answer: generic_candidates(answer)
    span: Callable[[str], str] = answer_span  # the part of a completion that states the answer
    wrong_answer: Callable[[Sample, str], str] | None = None  # a wrong answer (default: another allowed answer)
    # exploits the recipe knows and keeps, with the reason: "component:adversary" (or a component) -> why
    accepted: dict[str, str] = field(default_factory=dict)

    def forms(self, sample: Sample, reasoning: str, answer: str) -> list[str]:
        """`answer` in the layout, longest first: with `reasoning`, with none, and with an empty `<think></think>`
        dropped (the shortest completion that still states the answer in the form, for a small length limit)."""
        forms = [self.layout(sample, reasoning, answer), self.layout(sample, "", answer)]
        forms.append(_EMPTY_THINK.sub("", forms[-1], count=1))
        return list(dict.fromkeys(forms))

    def wrong(self, sample: Sample, answer: str, candidates: list[str] | None = None) -> str:
        """A wrong answer: the recipe's, else the first allowed answer (of `candidates`, the task's answer space,
        when given) that is not the right one, else a changed copy of it."""
        if self.wrong_answer is not None:
            return self.wrong_answer(sample, answer)
        for candidate in self.candidates(sample, answer) if candidates is None else candidates:
            if candidate.strip().lower() != answer.strip().lower():
                return candidate
        return "none" if answer.strip().lower() != "none" else "some"


DEFAULT_HINTS = AuditHints()
